"""HTTP tier: the API, through the Lambda handlers in this process or `dormant serve`, and the inspector."""
