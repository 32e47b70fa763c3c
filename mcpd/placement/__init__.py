"""Where mcpd's processes and model threads run: the plan, made from the board's CPU topology and
the config alone (plan.py), and its application (affinity.py)."""
