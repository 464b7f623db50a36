"""What the tests share: `waiting` (wait on state, never on the clock), `gateways` (gateways started the product's
way), `triton` (the session's Triton behind conftest's `triton` fixture), `processes` (what runs, from /proc; children
reaped), `hosts` (lab hosts in network namespaces), `manifests` (deploy/kubernetes read as data), `cluster` (what a
whole cluster needs installed), `learning` (the learning loop run to a target return)."""
