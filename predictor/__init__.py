"""KServe predictor for Clef-flash: System One over KServe's ModelServer, with vLLM or transformers engines."""
