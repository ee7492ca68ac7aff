"""Clef-flash on one GPU: transformers BF16 vs vLLM + plugin BF16 / FP8 / NVFP4, same records.

    python -m bench.gpu_benchmark --work /tmp/clefbench [--cases prepare,transformers,head,vllm-fp8-graphs,
        vllm-stock-fp8-graphs,http] [--records 1400] [--tokens 512] [--repeats 3] [--time-budget 540] [--profile]
    python -m bench.gpu_benchmark --device cpu --scale tiny --records 8 --work /tmp/smoke   # CPU smoke run

Stages (each engine case runs in its own process group, killed whole past the time budget, so a crash, a
leak or a left-over engine process cannot spoil the next):
- prepare: the random-weight BF16 release (``clef_tools.fullsize``, built on the device) and its
  FP8_DYNAMIC copy (``clef_tools.quantize``) unless ``--bf16``/``--fp8`` are given, and its NVFP4 copy
  (``--scheme NVFP4``) when an nvfp4 case is asked for (or ``--nvfp4`` names one); N seeded records
  (``clef_tools.sized_records``) encoded with the release's tokenizer. Cached in ``--work`` and reused.
- transformers: the reference engine (``TransformersScorer``) in BF16, length-sorted padded batches: a
  first pass in a fresh process (each new batch shape pays its one-off costs), then ``--repeats`` passes at
  steady state (the headline), the backbone alone, and the backbone/head split (first pass and steady).
- head: the joint schema head alone on random hidden states, per record at batch sizes 1/16/64; one
  record at a time through the dynamic forward, the static bucketed pass, and (CUDA) its graph replays.
- vllm-{bf16,fp8,nvfp4}-{eager,compile,graphs}: vLLM + the plugin, one offline ``encode`` over all records
  (NVFP4 on a GPU without FP4 tensor cores, such as Hopper, runs vLLM's weight-only Marlin FP4 fallback);
  then single-record latency. eager: no torch.compile, no CUDA graphs; compile: torch.compile only;
  graphs: torch.compile + piecewise CUDA graphs (the plugin's prefill sizes, or ``--capture-sizes``).
  With ``--profile``, one throughput batch and one single record also run under vLLM's torch profiler,
  and the GPU kernel time is summed by kind (GEMM, Gated DeltaNet, attention, ...). A case named twice runs twice
  (the second start measures the warm compile cache; its result is stored as ``<case>-again``, a third as
  ``<case>-again3``, and so on).
  Throughput is the median of ``--repeats`` passes over all records (min, max and every pass beside it).
- vllm-stock-{bf16,fp8}-{mode}: stock vLLM, no plugin loaded (``VLLM_PLUGINS`` empty): the release's own
  architecture, the same engine settings, vLLM's last-token ``embed`` pooler: the upper bound. In graphs mode
  that includes the plugin's compilation config, its custom ops too (``clef_plugin.api.CUSTOM_OPS``); stock vLLM
  with vLLM's own choice of ops is the variant ``--variant vdef='{"compilation_config":{"custom_ops":["none"]}}'``.
- vision: vLLM + the plugin on the FP8 release with its vision tower loaded (``engine_kwargs(vision=True)``),
  the engine settings of ``vllm-fp8-graphs`` (eager on the CPU), ``max_model_len`` at least
  ``--vision-max-model-len`` (4,096: room for 4 images of 1024×768). Text-only throughput over all records
  (its ratio to ``vllm-fp8-<mode>`` of the same invocation is added to the summary: the target is ≥ 0.98),
  then for 1 and 4 images of 448×448 and of 1024×768 per request (seeded random-noise JPEG files, each
  request's images named anew so no vLLM cache serves one twice) throughput over the first
  ``--vision-records`` records (64; image tokens counted) and ``--vision-latency-requests`` (16) lone
  requests; the decoding and preprocessing by the release's processor is timed on its own, per image.
- http, http-dp2: ``python -m predictor`` (vLLM engine, FP8 release, ``--http-mode``; ``--dp 2`` for
  http-dp2) and closed-loop HTTP clients (``--http-clients``, default 1/8/64/256; ``--http-requests`` per
  multi-client load, default 2,000; no body sent twice, so an answer cache cannot serve any). Then, for
  each of ``--http-repeat-fractions`` (e.g. ``0,0.5,0.9``), one load at ``--http-repeat-clients`` (64) in
  which that share of the requests repeats one of 8 bodies (the answer cache and in-flight merging at
  work; its hit/merged/miss counts beside the figures, the load's warm-up included). Needs the ``serve``
  extra's packages.
- ``<vllm case>+<name>``: that vLLM case again with the engine arguments of ``--variant name=JSON`` on
  top of ``--engine-args`` (a ``compilation_config`` there is merged into the mode's), e.g.
  ``--variant async='{"async_scheduling": true}' --cases prepare,vllm-fp8-graphs,vllm-fp8-graphs+async``;
  its logits are compared with the plain case's.
- ``http+<name>``, ``http-dp2+<name>``: that http case again with the extra predictor arguments of
  ``--http-args name='ARGS'`` (a shell-quoted string), e.g. ``--http-args enc4='--encode-processes 4'
  --cases prepare,http+enc0,http+enc4`` with ``--http-args enc0='--encode-processes 0'``; stored under
  its key (``http+enc4``).
Compile, Inductor and Triton caches (autotuning results included) live in ``--cache-dir`` (default:
``--work``/cache), shared by all cases, laid out as on a predictor pod's compile-cache volume.
Each case reports engine start, warm-up, records/s, prompt tokens/s and GPU memory. Agreement
(top-1 per question, mean KL(BF16 ‖ FP8), and likewise BF16 and FP8 against NVFP4) is computed from
the logits the cases saved in ``--work``, also across invocations, so the cases may run in separate calls.
Weights are random: figures measure speed, and agreement on random weights only bounds the numerical effect of FP8.
The summary goes to ``--out``/gpu_benchmark.json (default: the --work folder).

Modules: ``cli`` (options, the parent's run), ``names`` (cases, variants, compared pairs), ``prepare``
(releases and records), ``processes`` (each case in its own process group), ``reference_cases``
(transformers, head), ``vllm_case`` and ``engine_args``, ``vision_case``, ``http_case`` with ``metrics`` (the
predictor's /metrics), ``traces`` (profiler traces), ``timing`` (passes and their figures), ``report``
(agreement, the table), ``workdir`` (files in ``--work``).
"""
