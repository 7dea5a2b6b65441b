"""LoRA adapters: reading them (adapter.py) and the engine's registry + host cache (registry.py).

The device side is models/lora.py (the LoRALinear method, the runner's slots); which adapter
sits in which slot is the scheduler's call (core/lora_slots.py)."""
