"""GGUF files (llama.cpp, Ollama) as assembled models."""
