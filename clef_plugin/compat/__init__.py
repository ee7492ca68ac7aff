"""The plugin's one reach into vLLM internals, one module per concern, for the supported vLLM versions (0.26 on
GPUs, 0.32 on CPUs): CUDA left uninitialised by imports (:mod:`.cuda_probes`), the version check (:mod:`.version`),
prompt hidden states (:mod:`.hidden_states`), the config hook (:mod:`.config_hook`), processed images and videos
(:mod:`.processed_images`), the router-GEMM warm-up (:mod:`.router_gemm`) and FP8 on CPUs (:mod:`.cpu_fp8`).

Differences are detected by feature, not by version number, so a patch release that backports a change keeps
working. Nothing else in the plugin reaches into vLLM internals that moved. Each module has its pinning tests in
tests/plugin/compat/.
"""
