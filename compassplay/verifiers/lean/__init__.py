"""Lean 4 checking: the REPL client, a pool of REPLs, the fleet's routing and scaling decisions."""
