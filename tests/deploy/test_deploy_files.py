"""Static checks of the deployment files: they parse, name real metrics, resources and configs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from compassplay.config import LeanSection, RunConfig, load_config
from compassplay.executors.metrics import RunMetrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CLUSTER_YAML = REPO / "ray_cluster.yaml"
CONFIGS = sorted((REPO / "compassplay" / "configs").glob("*.yaml"))
# The paper-scale coding configs: one per compared proposer reward (tests/test_config.py checks
# they differ from paper_coding_7b only in the reward).
PAPER_CONFIGS = [REPO / "compassplay" / "configs" / f"{name}.yaml" for name in (
    "paper_coding_7b", "baseline_difficulty_7b", "baseline_soar_7b", "baseline_novelty_7b",
    "ablation_cos_novelty_7b")]
# The paper-scale Lean configs (tests/test_config.py checks their settings).
LEAN_PAPER_CONFIGS = [REPO / "compassplay" / "configs" / f"{name}.yaml" for name in (
    "paper_lean_7b", "ablation_lean_cos_7b", "baseline_lean_novelty_7b",
    "baseline_lean_difficulty_7b")]
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), CLUSTER_YAML])
JSON_FILES = sorted(DEPLOY.rglob("*.json"))
ROLES = ("proposer", "solver", "verifier", "scorer", "learner")
BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}
# Verifier node type -> the custom resource it advertises (and its actors ask for).
VERIFIER_NODES = {"python_verifier": "python_verifier", "lean_verifier": "lean_repl"}
VERIFIER_RESOURCES = set(VERIFIER_NODES.values())
INSTALL_LEAN = DEPLOY / "install_lean.sh"


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _kuberay_groups() -> dict[str, dict]:
    """groupName -> {rayStartParams, minReplicas, ...} of raycluster.yaml (head as 'head')."""
    spec = _yaml(DEPLOY / "kuberay" / "raycluster.yaml")["spec"]
    return {"head": spec["headGroupSpec"], **{g["groupName"]: g for g in spec["workerGroupSpecs"]}}


def _kuberay_resources(group: dict) -> dict[str, float]:
    """rayStartParams.resources is a quoted JSON string: '"{\\"name\\": 1}"'."""
    raw = group["rayStartParams"].get("resources")
    return json.loads(raw.strip().strip('"').replace('\\"', '"')) if raw else {}


def _node_types() -> dict[str, dict]:
    return _yaml(CLUSTER_YAML)["available_node_types"]


def _custom(res: dict) -> set[str]:
    return set(res) - BUILTIN


# ----------------------------------------------------------------------------- parsing
def test_deploy_files_exist():
    for name in ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "prometheus/prometheus.yml",
                 "grafana/compassplay_dashboard.json", "submit_job.sh", "README.md"):
        assert (DEPLOY / name).is_file(), name
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_yaml_parses(path):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs and all(isinstance(d, dict) for d in docs)


@pytest.mark.parametrize("path", JSON_FILES, ids=_rel)
def test_json_parses(path):
    assert isinstance(json.loads(path.read_text()), dict)


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_every_config_loads(path):
    assert isinstance(load_config(path), RunConfig)


def test_submit_script_is_valid_bash():
    res = subprocess.run(["bash", "-n", str(DEPLOY / "submit_job.sh")], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    text = (DEPLOY / "submit_job.sh").read_text()
    assert "job submit" in text and '--address "$RAY_ADDRESS"' in text
    assert '-- compassplay run --config "$CONFIG" "$@"' in text


# ----------------------------------------------------------------------------- ray cluster
def test_ray_cluster_yaml_passes_ray_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(_yaml(CLUSTER_YAML)))


def test_ray_cluster_node_types():
    cfg = _yaml(CLUSTER_YAML)
    types = _node_types()
    assert types[cfg["head_node_type"]]["resources"]["CPU"] == 0
    assert types["gpu_worker"]["resources"]["GPU"] == 8
    assert _custom(types["gpu_worker"]["resources"])
    for name, resource in VERIFIER_NODES.items():
        node = types[name]
        assert node["resources"][resource] >= 1 and node["resources"]["CPU"] > 0
        assert node["min_workers"] == 0 and node["max_workers"] > 0
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    assert "--metrics-export-port" in head_cmds and "--dashboard-host" in head_cmds
    assert any("[gpu" in c for c in cfg["setup_commands"])


def test_kuberay_cluster_matches_ray_cluster_yaml():
    spec = _yaml(DEPLOY / "kuberay" / "raycluster.yaml")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    groups = _kuberay_groups()
    assert groups["head"]["rayStartParams"]["num-cpus"] == "0"
    kuberay = set().union(*(_custom(_kuberay_resources(g)) for g in groups.values()))
    launcher = set().union(*(_custom(t.get("resources", {})) for t in _node_types().values()))
    assert kuberay == launcher
    for g in groups.values():
        if _custom(_kuberay_resources(g)) & VERIFIER_RESOURCES:
            assert g["minReplicas"] == 0 and g["maxReplicas"] > 0


def _documented(key: str) -> set[str]:
    """Resource names documented as `KEY: {NAME: 1}` in the deploy docs (each doc names some)."""
    pattern = re.compile(re.escape(key) + r":\s*\{\s*(\w+)\s*:")
    documented = set()
    for doc in (DEPLOY / "README.md", CLUSTER_YAML, DEPLOY / "kuberay" / "raycluster.yaml"):
        found = set(pattern.findall(doc.read_text().replace("\n#", " ").replace("  ", " ")))
        assert found, f"{_rel(doc)} documents no {key}"
        documented |= found
    return documented


def test_documented_verifier_resources_match_node_types():
    """`cluster.verifier.resources: {python_verifier: 1}` and `verifiers.lean.actor.resources:
    {lean_repl: 1}` in the docs name exactly the verifier nodes' resources."""
    python, lean = _documented("cluster.verifier.resources"), \
        _documented("verifiers.lean.actor.resources")
    assert python == {"python_verifier"} and lean == {"lean_repl"}
    assert set(LeanSection().actor.resources) == lean
    advertised = {r for t in _node_types().values() for r in _custom(t.get("resources", {}))}
    assert python | lean == VERIFIER_RESOURCES <= advertised


# ----------------------------------------------------------------------------- lean nodes
def test_default_lean_actor_fits_a_lean_node():
    lean = LeanSection()
    node = _node_types()["lean_verifier"]
    res = node["resources"]
    assert lean.actor.num_gpus == 0 and lean.actor.num_cpus <= res["CPU"]
    per_node = min(res[k] // v for k, v in lean.actor.resources.items())
    assert per_node >= 1 and res["CPU"] >= per_node * lean.actor.num_cpus
    # The fleet's ceiling can actually be placed on the node type's ceiling.
    assert lean.scaling.max_actors <= per_node * node["max_workers"]
    groups = _kuberay_groups()
    assert _kuberay_resources(groups["lean-verifier"]) == {"lean_repl": res["lean_repl"]}


@pytest.mark.parametrize("path", LEAN_PAPER_CONFIGS, ids=_rel)
def test_lean_paper_config_fleet_fits_the_lean_nodes(path):
    lean = load_config(path).verifiers.lean
    node = _node_types()["lean_verifier"]
    res = node["resources"]
    per_node = min(res[k] // v for k, v in lean.actor.resources.items())
    assert set(lean.actor.resources) == {"lean_repl"} and per_node >= 1
    assert res["CPU"] >= per_node * lean.actor.num_cpus and lean.actor.num_gpus == 0
    assert 1 < lean.scaling.max_actors <= per_node * node["max_workers"]
    assert lean.project_dir == "/home/ray/lean/mathlib4"  # where install_lean.sh puts Mathlib


def test_install_lean_script_installs_elan_toolchain_repl_and_mathlib():
    res = subprocess.run(["bash", "-n", str(INSTALL_LEAN)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    text = INSTALL_LEAN.read_text()
    assert text.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in text
    for needle in ("elan-init.sh", "leanprover-community/$repo", "for repo in repl mathlib4",
                   "lake exe cache get", "lake build", "repl/.lake/build/bin/repl",
                   "lake env repl"):
        assert needle in text, needle
    # Both repos are cloned at the same tag (the REPL must match Mathlib's toolchain).
    assert text.count('--branch "$LEAN_TAG"') == 1


def test_lean_nodes_run_the_install_script():
    script = "deploy/install_lean.sh"
    node = _node_types()["lean_verifier"]
    cmds = node["worker_setup_commands"]
    install = [c for c in cmds if script in c]
    assert install and "LEAN_HOME=/home/ray/lean" in install[0]
    assert cmds.index(install[0]) > max(i for i, c in enumerate(cmds) if "pip install" in c)
    assert any("git" in c and "curl" in c and "apt-get" in c for c in cmds)
    spec = _kuberay_groups()["lean-verifier"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert script in " ".join(init["command"])
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["LEAN_HOME"] == "/home/ray/lean"
    tag = re.search(r"LEAN_TAG=(\S+)", install[0]).group(1)
    assert env["LEAN_TAG"] == tag
    (worker,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts["lean"] == env["LEAN_HOME"]
    assert {m["name"] for m in init["volumeMounts"]} == {"lean"}
    wenv = {e["name"]: e["value"] for e in worker["env"]}
    assert wenv["PATH"].split(":")[0] == env["BIN_DIR"]
    assert wenv["ELAN_HOME"] == env["ELAN_HOME"]
    # The documented project dir is where the script puts Mathlib.
    for doc in (CLUSTER_YAML, DEPLOY / "kuberay" / "raycluster.yaml", DEPLOY / "README.md"):
        assert "verifiers.lean.project_dir=/home/ray/lean/mathlib4" in doc.read_text(), doc


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_config_resources_exist_on_some_node_type(path):
    """Every actor's demand fits one worker node type, or Ray could never place it."""
    cfg = load_config(path)
    workers = [t["resources"] for name, t in _node_types().items() if name != "head"]
    for role in ROLES:
        res = getattr(cfg.cluster, role)
        demand = {"CPU": res.num_cpus, "GPU": res.num_gpus, **res.resources}
        assert any(all(node.get(k, 0) >= v for k, v in demand.items() if v) for node in workers), \
            f"{_rel(path)}: cluster.{role} {demand} fits no node type of ray_cluster.yaml"


@pytest.mark.parametrize("path", PAPER_CONFIGS + LEAN_PAPER_CONFIGS, ids=_rel)
def test_paper_config_learner_and_scorers_pack_on_one_gpu_node(path):
    cfg = load_config(path)
    c, n = cfg.cluster, cfg.scorer.num_scorers
    assert c.placement == "pack_scorers_with_learner"
    node = _node_types()["gpu_worker"]["resources"]
    ranks = cfg.learner.num_ranks
    gpus = ranks * c.learner.num_gpus + n * c.scorer.num_gpus
    cpus = ranks * c.learner.num_cpus + n * c.scorer.num_cpus
    assert gpus <= node["GPU"] and cpus <= node["CPU"]
    for name, amount in {**c.learner.resources}.items():
        assert node[name] >= ranks * amount
    # Everything GPU-side of one run fits one 8-GPU node.
    assert gpus + c.proposer.num_gpus + c.solver.num_gpus <= node["GPU"]


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=_rel)
def test_paper_configs(path):
    cfg = load_config(path)
    assert cfg.model.source == "hub" and cfg.model.name_or_path == "Qwen/Qwen2.5-Coder-7B"
    assert cfg.model.dtype == "bfloat16"
    assert cfg.proposer.engine == cfg.solver.engine == "vllm"
    assert cfg.solver.n_samples == 8
    assert set(cfg.task.types) == {"deduction", "abduction", "induction"}
    assert cfg.learner.backend == "deepspeed" and cfg.learner.zero_stage == 3
    assert cfg.learner.num_ranks == 4
    assert cfg.scorer.num_scorers == 2 and cfg.pipeline.staleness == 1
    assert cfg.pipeline.steps == 200 and cfg.logging.prometheus_port == 9400
    assert cfg.reference.path == "reference_math_paper32.jsonl"
    assert cfg.cluster.verifier.resources == {"python_verifier": 1.0}
    for role in ("proposer", "solver", "scorer", "learner"):
        assert getattr(cfg.cluster, role).num_gpus >= 1


def test_rayjob_runs_an_existing_config():
    job = _yaml(DEPLOY / "kuberay" / "rayjob.yaml")
    assert job["kind"] == "RayJob"
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == \
        _yaml(DEPLOY / "kuberay" / "raycluster.yaml")["metadata"]["name"]
    entry = job["spec"]["entrypoint"].split()
    assert entry[:2] == ["compassplay", "run"]
    config = entry[entry.index("--config") + 1]
    assert config == "paper_coding_7b"  # a shipped config, found by name in the package
    load_config(config, [a for a in entry[entry.index("--config") + 2:] if "=" in a])


# ----------------------------------------------------------------------------- monitoring
def test_prometheus_scrapes_ray_and_the_driver():
    prom = _yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    files = [f for sd in jobs["ray"]["file_sd_configs"] for f in sd["files"]]
    assert files == ["/tmp/ray/prom_metrics_service_discovery.json"]
    targets = [t for sc in jobs["compassplay"]["static_configs"] for t in sc["targets"]]
    ports = {load_config(p).logging.prometheus_port for p in PAPER_CONFIGS}
    assert {int(t.rsplit(":", 1)[1]) for t in targets} == ports


def _exposed_names() -> dict[str, set[str]]:
    """Family -> sample names as Prometheus scrapes them (counters _total, histograms _bucket...)."""
    names = {}
    for family in RunMetrics().registry.collect():
        if family.type == "counter":
            names[family.name] = {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names[family.name] = {f"{family.name}_{s}" for s in ("bucket", "sum", "count",
                                                                   "created")}
        else:
            names[family.name] = {family.name}
    return names


def _dashboard_queries(dash: dict) -> list[str]:
    exprs = []

    def walk(node):
        if isinstance(node, dict):
            for key, val in node.items():
                if key in ("expr", "definition") and isinstance(val, str):
                    exprs.append(val)
                elif key == "query" and isinstance(val, str):
                    exprs.append(val)
                else:
                    walk(val)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dash)
    return exprs


def test_grafana_dashboard_uses_only_real_metrics():
    dash = json.loads((DEPLOY / "grafana" / "compassplay_dashboard.json").read_text())
    used = set()
    for expr in _dashboard_queries(dash):
        used |= set(re.findall(r"\bcompassplay_[a-z0-9_]+", expr))
    by_family = _exposed_names()
    exposed = set().union(*by_family.values())
    assert used, "the dashboard queries no compassplay_* metric"
    assert used <= exposed, f"not exported by compassplay.executors.metrics: {sorted(used - exposed)}"
    # Every metric of the registry has a panel.
    missing = sorted(f for f, names in by_family.items() if not names & used)
    assert not missing, f"metrics without a panel: {missing}"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_metric_names_appear_in_the_scraped_exposition():
    """The same check against prometheus-client's real text output (labelled metrics set)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    m = RunMetrics()
    m.stage_seconds.labels("propose").observe(1.0)
    m.queue_depth.labels("steps").set(1)
    m.observe_verifiers({"verifier-0": {"counts": {"ok": 3}, "runs_total": 3},
                         "verifier-1": {"counts": {"ok": 2, "timeout": 1}, "runs_total": 3}}, 1.0)
    m.solve_rate.observe(0.5)
    m.observe_nodes({"gpu_worker": 1}, ["python_verifier"])
    text = generate_latest(m.registry).decode()
    samples = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    dash = json.loads((DEPLOY / "grafana" / "compassplay_dashboard.json").read_text())
    used = {n for e in _dashboard_queries(dash) for n in re.findall(r"\bcompassplay_[a-z0-9_]+", e)}
    assert used <= samples, sorted(used - samples)
