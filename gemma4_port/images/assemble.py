"""`build.py images`: plan (plan.py), prepare what the builds need on the host (host_inputs.py), drive
Docker (docker_driver.py), and print a summary: image, tag, digest, size, bytes pushed."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from gemma4_port.console import console as build_console
from gemma4_port.images.dockerfile import render_dockerfile
from gemma4_port.images.host_inputs import host_inputs, stage_context
from gemma4_port.images.plan import pin_base, plan_images
from gemma4_port.images.project import SERVER_ENTRY, image_options, project_files
from gemma4_port.images.spec import SLIM_TP, ImageError, ImageSpec
from gemma4_port.source.manifest import load_manifest


def write_dockerfiles(specs: list[ImageSpec], folder: Path) -> list[Path]:
    """Each image's rendered Dockerfile as DIR/KIND.Dockerfile (for linters and review)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        path = folder / f"{spec.kind}.Dockerfile"
        path.write_text(render_dockerfile(spec))
        written.append(path)
    return written


def print_plan(specs: list[ImageSpec], console: Console) -> None:
    for spec in specs:
        parts = sorted({what.split(":")[0] if what.startswith("code:") else what for _, what in spec.context})
        console.rule(f"{spec.kind}: {spec.ref}  (FROM {spec.from_image})")
        console.print(f"# context: {', '.join(parts) or 'none'}", highlight=False, markup=False)
        console.print(render_dockerfile(spec), highlight=False, markup=False, soft_wrap=True)


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _buildkit_base(driver, spec: ImageSpec, context: Path, log: Console):
    """The neuron base with a weights secret is built by buildx (the classic builder cannot mount
    secrets); the slim images then build FROM it here."""
    built = driver.existing(spec.ref)
    if built is None:
        raise ImageError(
            f"build base: the neuron base downloads the weights with a BuildKit secret, which the docker SDK's "
            f"classic builder cannot pass; run `docker buildx build --load --secret id=hf_token,env=HF_TOKEN "
            f"-t {spec.ref} {context}` (context staged there) and rerun, or use --weights copy"
        )
    log.print(f"using {spec.ref} built with buildx ({built.image_id[:19]}); rebuild it there after a change")
    return built


def summary(title: str, rows: list) -> Table:
    """image, tag, digest (the image id if not pushed), size (what a slim adds), build time, push."""
    table = Table(title=title)
    for col in ("image", "tag", "digest", "size", "build", "layers pushed", "bytes pushed"):
        table.add_column(col, justify="right" if col in ("size", "build", "bytes pushed") else "left")
    base_size = rows[0][1].size  # the base is always built first
    for spec, built, pushed in rows:
        own = "" if spec.kind == "base" else f" (+{_size(built.size - base_size)})"
        table.add_row(
            spec.kind,
            spec.ref,
            pushed.digest[:19] if pushed else built.image_id[:19],
            _size(built.size) + own,
            f"{built.seconds:.0f} s",
            f"{pushed.uploaded} new, {pushed.reused} reused" if pushed else "not pushed",
            _size(pushed.bytes_pushed) if pushed else "-",
        )
    return table


def images_main(args) -> int:
    out = build_console()
    log = Console(stderr=True, soft_wrap=True)  # build logs as they come, never re-wrapped
    if args.out and not args.dry_run:
        raise ImageError("--out writes the rendered Dockerfiles of a --dry-run: add --dry-run")
    manifest = load_manifest(args.manifest)
    options = image_options(args, manifest)
    build_files, server_files = project_files()
    specs = plan_images(manifest, options, build_files, server_files)
    if args.dry_run:
        print_plan(specs, out)
        if args.out:
            for path in write_dockerfiles(specs, Path(args.out)):
                out.print(f"wrote {path}", highlight=False)
        return 0
    missing = [f for f in SERVER_ENTRY if f not in server_files]
    if missing and any(s.kind in SLIM_TP for s in specs):
        raise ImageError(f"plan: {', '.join(missing)} missing: the slim images run `python -m runtime.serve`")

    from gemma4_port.images.docker_driver import Driver

    driver = Driver(log)  # first: a daemon that is not there fails before any slow step
    base = next(s for s in specs if s.kind == "base")
    buildkit_base = options.flavour == "neuron" and options.weights == "secret" and manifest.model.source
    sources = host_inputs(manifest, options, base, driver, log)

    rows = []
    base_digest = None
    for spec in specs:
        if spec.kind != "base":
            digest = base_digest or driver.repo_digest(base)
            spec = pin_base(spec, digest) if digest else spec
        context = stage_context(
            spec, render_dockerfile(spec), Path("build/images") / manifest.name / spec.kind, sources
        )
        if spec.kind == "base" and buildkit_base:
            built = _buildkit_base(driver, spec, context, log)
        else:
            built = driver.build(spec, context, network="none" if options.flavour == "cpu" else None)
        log.print(f"[green]built[/] {spec.ref} ({_size(built.size)}, {built.seconds:.0f} s)")
        ready = driver.smoke(spec.ref) if spec.kind in SLIM_TP and options.flavour == "cpu" else None
        if ready is not None:
            log.print(f"[green]ready[/] {spec.ref}: /ready 200 after {ready:.0f} s (self-test passed)")
        pushed = driver.push(spec) if args.push else None
        if pushed and spec.kind == "base":
            base_digest = pushed.digest
        rows.append((spec, built, pushed))

    out.print(summary(f"{manifest.name} images ({options.flavour})", rows))
    return 0
