"""The Lean fleet on Ray: the fleet, its actor, and the LeanVerifier actors it sizes."""
