"""The built-in plugins, each registered exactly as a third-party plugin is (the registry loads them
by name: :data:`transformer_kit.core.registry.BUILTIN_PLUGINS`):

- ``builtin`` (:mod:`.builtin`): the model's components (attention kernels, positional
  encodings, masks, blocks, feed-forwards, norms, poolings) with their ONNX lowerings, and the
  checkpoint families; it needs torch;
- ``builtin.decoding`` (:mod:`.decoding`): the logits processors, with numpy and llguidance
  only, so that an install without torch decodes an export with every option.
"""
