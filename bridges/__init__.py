"""The framework bridges 04 runs an episode through (schemas.BLACKBOXES): pydantic-ai, smolagents' native tool
calling (the Claude Code column) and smolagents' text mode, each driving the real framework's agent loop with the
policy as its model."""
