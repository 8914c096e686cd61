"""Deployed tier: what a deployment is made of (template, layers), and the stack run by the fidelity harness."""
