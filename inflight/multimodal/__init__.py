"""Images and video for vision-language models: fetch and decode media (media.py), preprocess like
the model's Hugging Face processor (qwen2_vl_processor.py: Pillow + NumPy), and describe each item
to the engine (inputs.py: placeholder span, content hash, M-RoPE positions).

Pure Python + NumPy + Pillow: no torch here. The engine calls it while it makes a request (on the
caller's thread); the runner gets NumPy pixel arrays inside `NewRequestData` and runs the encoder.
"""
