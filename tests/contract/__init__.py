"""Contract tier: stores and adapters held to their contracts on the real engines they talk to."""
