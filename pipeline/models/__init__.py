"""Where pretrained weights come from (a folder, the hub, package:MODULE, a GGUF file), and LoRA adapters on them."""
