"""The Triton service's schema: the `triton:` profile section (its services, connections, gate and
GPUs) and the shapes of what the tool renders, checked on what a state file hands back.

Parsing a profile imports this subpackage only: no service code, no tritonclient."""
