"""gemma4-inf2's command line: compile, verify, plan, serve, images, bench, doctor, train-tiny.

Each subcommand parses its arguments here and hands typed values to one module; errors that a
user can fix come back as one line on stderr and exit code 2, never as a traceback. From a checkout
it runs as `python build.py COMMAND`, installed as `gemma4-inf2 COMMAND` (or `python -m gemma4_port`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _manifest(arg: str) -> Path:
    """A manifest argument: a YAML file, or the name of a shipped one (tiny-e2b, gemma-4-e2b, ...)."""
    from gemma4_port.source.manifest import find_manifest

    return find_manifest(arg)


def _compile(args) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from gemma4_port.compile.backends import compile_artifact
    from gemma4_port.source.manifest import load_manifest

    manifest = load_manifest(args.manifest)
    variant = manifest.variant(args.variant)
    out = Path(args.out or f"artifacts/{manifest.name}-{variant.name}")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=False) as p:
        compile_artifact(manifest, variant, out, backend=args.backend, progress=p)
    print(f"artifact written to {out}")
    return 0


def _verify(args) -> int:
    from gemma4_port.verify.run import verify_artifact

    return verify_artifact(Path(args.dir), long=not args.quick, json_out=args.json_out and Path(args.json_out))


def _plan(args) -> int:
    from gemma4_port.ops.plan import plan_main

    return plan_main(args)


def _serve(args) -> int:
    from runtime.serve import serve

    return serve(Path(args.dir), host=args.host, port=args.port, backend=args.backend)


def _doctor(args) -> int:
    from gemma4_port.ops.doctor.main import doctor_main

    return doctor_main(args)


def _images(args) -> int:
    from gemma4_port.images.assemble import images_main

    return images_main(args)


def _train_tiny(args) -> int:
    from gemma4_port.source.train_tiny import train_tiny_main

    return train_tiny_main(args)


def _bench(args) -> int:
    from gemma4_port.bench.run import bench_main

    return bench_main(args)


MANIFEST_HELP = "a manifest YAML file, or a shipped manifest's name (tiny-e2b, gemma-4-e2b, ...)"


def parser() -> argparse.ArgumentParser:
    # `python -m gemma4_port` would otherwise call itself __main__.py in its usage line
    prog = "python -m gemma4_port" if sys.argv[0].endswith("__main__.py") else None
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="trace, lint and package the device graphs of one manifest variant")
    c.add_argument("manifest", type=_manifest, help=MANIFEST_HELP)
    c.add_argument("--variant", help="variant name (default: the manifest's first)")
    c.add_argument("--out", help="artifact directory (default: artifacts/NAME-VARIANT)")
    c.add_argument(
        "--backend",
        choices=["cpu", "neuron"],
        default="cpu",
        help="cpu: TorchScript graphs, runs anywhere; neuron: Inferentia2 (needs the Neuron SDK) (default: cpu)",
    )
    c.set_defaults(run=_compile)

    v = sub.add_parser("verify", help="load an artifact as the server does and match the float reference")
    v.add_argument("dir", help="an artifact directory from `build.py compile`")
    v.add_argument("--quick", action="store_true", help="golden and short prompts only (skip the kv_max run)")
    v.add_argument("--json", dest="json_out", metavar="OUT", help="also write every row's figures per step as JSON")
    v.set_defaults(run=_verify)

    pl = sub.add_parser("plan", help="bytes per NeuronCore and host RAM per variant, with verdicts")
    pl.add_argument("manifest", type=_manifest, help=MANIFEST_HELP)
    pl.add_argument("--variant", help="plan this variant only (default: every variant)")
    pl.add_argument("--shards", action="store_true", help="print the per-layer sharding plan")
    pl.set_defaults(run=_plan)

    s = sub.add_parser("serve", help="serve an artifact with the OpenAI API (gunicorn)")
    s.add_argument("dir", help="an artifact directory from `build.py compile`")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8080, help="port to bind (default: 8080)")
    s.add_argument(
        "--backend",
        choices=["auto", "cpu", "neuron"],
        default="auto",
        help="auto: what the artifact was compiled for; cpu or neuron must match it (default: auto)",
    )
    s.set_defaults(run=_serve)

    d = sub.add_parser(
        "doctor",
        help="check this inf2 machine against the pins, then compile, verify, serve (and measure) every "
        "Neuron layout on the tiny manifests and a shipped variant of each model at its real shapes "
        "(random weights); a report folder to attach",
    )
    d.add_argument("--json", dest="json_out", help="also write the report as JSON here")
    d.add_argument(
        "--layouts", help="comma-separated subset of tp1,batch4,tp2-device-prefill,tp2-host-prefill,e2b,e4b,12b"
    )
    d.add_argument("--work", help="the report folder: report, artifacts and every log (default: under the cache)")
    d.set_defaults(run=_doctor)

    i = sub.add_parser("images", help="build (and push) the base / slim / tp2-slim images")
    i.add_argument("manifest", type=_manifest, help=MANIFEST_HELP + "; its `images` section names the tags")
    i.add_argument(
        "--tags",
        help="comma-separated images (base, slim, tp2-slim) or their tags to build, with the "
        "base they need (default: all the manifest tags)",
    )
    i.add_argument("--registry", help="HOST:PORT to tag and push to")
    i.add_argument(
        "--push",
        action="store_true",
        help="push each image after it is built (a cpu slim image only after its self-test passed in a container)",
    )
    i.add_argument("--base-image", help="the OS image the base starts FROM")
    i.add_argument(
        "--flavour",
        choices=["neuron", "cpu"],
        default=None,
        help="neuron images (inf2) or the CPU development flavour "
        "(default: neuron for hub models, cpu for random test models)",
    )
    i.add_argument(
        "--weights",
        choices=["secret", "copy"],
        default=None,
        help="neuron base: download the weights in the build with a BuildKit secret (buildx; default) "
        "or copy the checkpoint downloaded on this host (works with the docker SDK)",
    )
    i.add_argument("--dry-run", action="store_true", help="print the plan and Dockerfiles; no daemon needed")
    i.add_argument("--out", help="with --dry-run: also write each rendered Dockerfile to OUT/KIND.Dockerfile")
    i.set_defaults(run=_images)

    t = sub.add_parser(
        "train-tiny",
        help="train the tiny chat model and its drafter on the CPU (minutes; run it with nice) "
        "and print their digests for manifests/tiny-chat.yaml",
    )
    t.add_argument("--out", help="folder for target/ and drafter/ (default: gemma4_port/checkpoints/tiny-chat)")
    t.set_defaults(run=_train_tiny)

    b = sub.add_parser("bench", help="speed and memory side by side, as ratios")
    b.add_argument(
        "dir",
        nargs="?",
        help="an artifact directory to measure (default: compile the --model-scale manifest into a temp dir)",
    )
    b.add_argument(
        "--model-scale",
        choices=["tiny", "small"],
        default="tiny",
        help="without DIR: tiny-e2b, or small-e2b (the real E2B layer shapes, 7 layers) (default: tiny)",
    )
    b.add_argument(
        "--json",
        dest="json_out",
        help="where to write the results as JSON, with a PNG of the plots "
        "beside it (default: artifacts/bench-SCALE.json; with --speculative artifacts/bench-speculative.json)",
    )
    b.add_argument(
        "--speculative",
        action="store_true",
        help="measure speculative decoding instead: a trained pair (DIR with target/ and drafter/, default the "
        "shipped tiny-chat) alone, with its drafter and with prompt lookup, and the predicted gain on inf2",
    )
    b.set_defaults(run=_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from contract.errors import Gemma4Error

    try:
        return args.run(args)
    except Gemma4Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
