"""What leaves the project: an extended model exported to where it runs (:mod:`easy_context.export.gguf`: a GGUF
file for llama.cpp / ollama)."""
