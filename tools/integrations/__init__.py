"""First-class integrations a team enables in ``opsloop.yaml`` (``integrations:``):
GitHub (Actions deploys, issues, comments) and PagerDuty (on-call, incidents). Each is
a tool source like the MCP servers and HTTP actions, behind the same policy rules."""
