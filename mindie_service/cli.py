"""`mindie-service serve | worker | demo-model | demo-lora | gen-certs | quantize | generate`."""
from __future__ import annotations

import argparse
import logging
import sys

from mindie_service.vllm_cli import add_vllm_flags, arg_problem, config_overrides, refusal, uses_vllm_flags

# mindie_service.devkit.presets.PRESETS' names (importing it here would load torch for every command;
# tests/unit/test_cli_help.py keeps the two equal)
DEMO_PRESETS = ("tiny", "tiny-eos", "tiny-think", "small", "tiny-draft", "small-draft", "tiny-vl", "tiny-audio")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mindie-service", description="MindIE-style LLM inference service")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                   help="DEBUG, INFO, WARNING, ERROR or CRITICAL, any case (default: INFO)")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="start the HTTP(S) server", allow_abbrev=False,
                       usage="mindie-service serve [MODEL] [--config CONFIG] [--prepare] [vLLM flags]")
    s.add_argument("--config", default="conf/config.json", help="MindIE's config.json (default: conf/config.json)")
    s.add_argument("--prepare", action="store_true",
                   help="place the packaged model and development certificates the config names where nothing "
                        "exists yet (never a demo model, never into an existing folder)")
    add_vllm_flags(s)

    w = sub.add_parser("worker", help="join a multi-node tensor-parallel instance as rank R (multiNodesInferEnabled)")
    w.add_argument("--config", default="conf/config.json",
                   help="the same config.json as the server's (default: conf/config.json)")
    w.add_argument("--rank", type=int, default=None, help="this process's rank (default: env RANK)")
    w.add_argument("--instance", type=int, default=0, help="the model instance (npuDeviceIds group) to join")

    d = sub.add_parser("demo-model", help="build a random-weight demo checkpoint with a locally trained tokenizer")
    d.add_argument("--preset", default="tiny", metavar="{" + ",".join(DEMO_PRESETS) + "}",
                   help="tiny (1.3M-parameter Llama), tiny-eos (tiny with a reachable EOS), "
                        "tiny-think (tiny with a Qwen3-style thinking template), small (32M Llama), "
                        "tiny-draft / small-draft (the first layer of tiny / small: speculative-decoding drafts), "
                        "tiny-vl (LLaVA), tiny-audio (Qwen2-Audio); random weights (default: tiny). An unknown "
                        "name exits 2 with one line naming the presets")
    d.add_argument("--out", required=True, help="the checkpoint folder to write")
    d.add_argument("--seed", type=int, default=0, help="the weights' random seed (default: 0)")
    d.add_argument("--if-missing", action="store_true",
                   help="do nothing if OUT holds a checkpoint this devkit version built; rebuild a stale one")

    lo = sub.add_parser("demo-lora", help="build a random PEFT LoRA adapter for a base checkpoint")
    lo.add_argument("--base", required=True, help="the base checkpoint folder the adapter is for")
    lo.add_argument("--out", required=True, help="the adapter folder to write")
    lo.add_argument("--rank", type=int, default=8, help="LoRA rank r (default: 8)")
    lo.add_argument("--seed", type=int, default=0, help="the weights' random seed (default: 0)")

    c = sub.add_parser("gen-certs", help="write a development CA, server and client certificates (ECDSA P-256, "
                                         "valid 90 days: Mozilla's modern profile)")
    c.add_argument("--out", default="security",
                   help="folder for ca/, certs/ and keys/ (the shipped config's layout; default: security)")
    c.add_argument("--if-missing", action="store_true", help="keep certificates OUT already holds")
    c.add_argument("--force", action="store_true",
                   help="replace certificates OUT already holds (without it they are kept and the command exits 2: "
                        "a new CA breaks the clients of a server using the old one)")

    q = sub.add_parser("quantize", help="write an msModelSlim-layout int8 checkpoint (w8a8: W8A8_DYNAMIC)")
    q.add_argument("--in", dest="src", required=True, help="float checkpoint folder, or a .gguf file (dequantized first)")
    q.add_argument("--out", required=True, help="output folder")
    q.add_argument("--scheme", choices=("w8a8", "w8a16"), default="w8a8",
                   help="w8a8: int8 weights and activations; w8a16: int8 weights only (default: w8a8)")

    g = sub.add_parser("generate", help="offline generation for a quick look")
    g.add_argument("--model", required=True, help="a checkpoint folder")
    g.add_argument("--max-tokens", type=int, default=32, help="tokens per prompt, greedy (default: 32)")
    g.add_argument("prompts", nargs="+", help="one or more prompts")
    return p


def _devkit(args: argparse.Namespace) -> None:
    """The build commands of mindie_service.devkit."""
    if args.command == "demo-model":
        from mindie_service.devkit.presets import build_demo_model
        build_demo_model(args.preset, args.out, seed=args.seed, if_missing=args.if_missing)
    elif args.command == "demo-lora":
        from mindie_service.devkit.lora import build_demo_lora
        build_demo_lora(args.base, args.out, rank=args.rank, seed=args.seed)
    else:
        from mindie_service.devkit.certs import generate_dev_certs
        generate_dev_certs(args.out, if_missing=args.if_missing, force=args.force)


def _serve(args: argparse.Namespace, extra: list[str]) -> int:
    """`serve`: the config file, with vLLM's flags (mindie_service.vllm_cli) over it."""
    problem = refusal(extra) or arg_problem(args)
    if problem is not None:
        print(f"mindie-service serve: {problem}", file=sys.stderr)
        return 2
    if args.enable_log_requests is not None:  # the access log's per-request lines (errors are warnings: kept)
        logging.getLogger("tornado.access").setLevel(logging.INFO if args.enable_log_requests else logging.WARNING)
    from mindie_service.serve_wiring import cli_wiring
    from mindie_service.server.main import serve
    overrides = config_overrides(args) if uses_vllm_flags(args) else None
    return serve(args.config, cli_wiring(args.prepare), overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return _serve(args, extra)
    if args.command == "worker":
        from mindie_service.config import load_config
        from mindie_service.engine.runner.parallel.join import join_instance
        try:
            join_instance(load_config(args.config).engine_config(0, instance=args.instance), args.rank)
        except ValueError as exc:  # a bad config or rendezvous setting: one line, not a traceback
            print(f"mindie-service worker: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command in ("demo-model", "demo-lora", "gen-certs"):
        try:
            _devkit(args)
        except ValueError as exc:  # a bad preset, rank or target: one line, not a traceback
            print(f"mindie-service {args.command}: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "quantize":
        from mindie_service.models.msmodelslim import write_quantized
        try:
            print(write_quantized(args.src, args.out, args.scheme))
        except ValueError as exc:
            print(f"mindie-service quantize: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "generate":
        from mindie_service import LLM, SamplingParams
        # the schedule holds these prompts and no more: the KV pool is sized for them, not for 200 sequences
        llm = LLM(model=args.model, max_batch_size=len(args.prompts))
        for out in llm.generate(args.prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0)):
            print(repr(out.outputs[0].text))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
