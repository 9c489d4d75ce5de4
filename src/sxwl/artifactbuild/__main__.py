"""``python -m sxwl.artifactbuild`` (``make artifact``): see docs/artifact.md, "Building"."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sxwl.artifactbuild.build import EXIT_PARTIAL, Options, build


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the offline artifact 3k-artifact.tgz.")
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: dist/3k-artifact.tgz")
    parser.add_argument("--arch", choices=["amd64", "arm64"], default="amd64")
    parser.add_argument("--cloud", default="", help="the cloud's URL, the default of deploy all's --cloud")
    parser.add_argument("--cache", type=Path, default=None, help="default: .cache/artifact")
    parser.add_argument("--python", default="", help="3kctl for another CPython, e.g. 3.12 (from wheels)")
    parser.add_argument("--kk", type=Path, default=None, help="a KubeKey binary built elsewhere")
    parser.add_argument(
        "--kubekey-artifact", type=Path, default=None, help="`kk artifact export` output made elsewhere"
    )
    args = parser.parse_args()
    repo = Path.cwd()
    default = "3k-artifact.tgz" if args.arch == "amd64" else f"3k-artifact-{args.arch}.tgz"
    output = (args.output or repo / "dist" / default).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    opts = Options(repo=repo, output=output, arch=args.arch, cache=args.cache, cloud=args.cloud, kk=args.kk,
                   kubekey_artifact=args.kubekey_artifact, python=args.python)  # fmt: skip
    result = build(opts)
    say = opts.progress.say
    for part, size in result.sizes.items():
        say(f"  {part:<14} {size / 1e6:9.1f} MB")
    say(f"{result.output}: {result.size / 1e6:.1f} MB, sha256 {result.sha256}")
    if result.partial:
        say(f"PARTIAL artifact: {len(result.missing)} part(s) could not be made here:")
        for missing in result.missing:
            say(f"  ✗ {missing.path}: {missing.reason}")
        sys.exit(EXIT_PARTIAL)


if __name__ == "__main__":
    main()
