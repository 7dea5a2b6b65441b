"""The /v2 generate API: MindIE and Triton / TensorRT-LLM names and outputs. Routes: `api.router(ctx)`."""
