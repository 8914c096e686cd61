"""The CDK app that deploys dormant: one construct per component, composed by ``stack.DormantStack``."""
