"""The OS-isolated Python sandbox: a pool of zygotes behind bubblewrap, seccomp and cgroups."""
