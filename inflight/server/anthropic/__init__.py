"""Anthropic's Messages API: /v1/messages (streaming, tools, thinking) and /v1/messages/count_tokens. Routes: `api.router(ctx)`."""
