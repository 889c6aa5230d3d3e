#!/usr/bin/env python3
"""Catalog of the EKS node images the local AWS emulator pretends AWS publishes.

One deterministic list of images (no randomness, no clock) from which two
things are derived:

* hack/moto/amis.json -- the images in moto's MOTO_AMIS_PATH format. moto
  loads that file into every region's EC2 backend, so DescribeImages (by id,
  by owner 602401143452 or, for Windows, 801119661308, by name filter, ...)
  finds them, and they survive POST /moto-api/reset like real public images
  would. Windows images carry moto's `platform` "windows" (DescribeImages
  shows <platform>windows</platform>); the Linux ones have no platform.
* the SSM public parameters under /aws/service/... that point at them
  (ssm_parameters()), which hack/moto/server.py writes into moto's SSM backend.

Regenerate amis.json after changing this file:

    python3 hack/moto/eks_images.py --write     # rewrite hack/moto/amis.json
    python3 hack/moto/eks_images.py --check     # exit 1 if it is stale

server.py refuses to start if amis.json is stale.

Shapes follow the real parameter trees (the ones Karpenter resolves):

  AL2023      /aws/service/eks/optimized-ami/<k8s>/amazon-linux-2023/<arch>/<variant>/recommended/image_id
              /aws/service/eks/optimized-ami/<k8s>/amazon-linux-2023/<arch>/<variant>/<image name>/image_id
  AL2         /aws/service/eks/optimized-ami/<k8s>/amazon-linux-2[-arm64|-gpu]/recommended/image_id
              /aws/service/eks/optimized-ami/<k8s>/amazon-linux-2[-arm64|-gpu]/<image name>/image_id
  Bottlerocket /aws/service/bottlerocket/aws-k8s-<k8s>[-nvidia]/<arch>/latest/image_id
              /aws/service/bottlerocket/aws-k8s-<k8s>[-nvidia]/<arch>/<version>/image_id
  Windows     /aws/service/ami-windows-latest/Windows_Server-<2019|2022|2025>-English-Core-EKS_Optimized-<k8s>/image_id

Every image family has two releases per Kubernetes minor; "recommended" and
"latest" point at the newer one, the older one stays reachable through its
pinned path (useful to test pinned aliases and drift). Windows has no pinned
parameter (AWS publishes only the latest one, which is why Windows aliases
only take `latest`): its older release is found by name, e.g.
Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.10.15. The Windows
images are x86_64 only, owned by Amazon's Windows account (801119661308, not
the EKS one) and boot legacy-bios.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

OWNER_ID = "602401143452"  # the account that publishes the EKS-optimized AMIs
WINDOWS_OWNER_ID = "801119661308"  # Amazon's Windows AMIs, the EKS-optimized ones included

# Kubernetes minor -> the patch release the node images ship.
K8S_PATCH = {"1.32": "1.32.9", "1.33": "1.33.5", "1.34": "1.34.1"}
K8S_MINORS = list(K8S_PATCH)

# EKS AMI releases (AL2 and AL2023), oldest first; the last one is "recommended".
EKS_RELEASES = [
    ("v20251015", "2025-10-15T04:21:37.000Z"),
    ("v20251101", "2025-11-01T03:47:12.000Z"),
]

# Bottlerocket releases (version, build id, creation date), oldest first.
BOTTLEROCKET_RELEASES = [
    ("1.49.0", "9e4c1b7d", "2025-10-09T18:02:44.000Z"),
    ("1.50.0", "3a6f2e81", "2025-10-30T17:15:09.000Z"),
]

# EKS-optimized Windows releases (version, creation date), oldest first; the last one
# is what /aws/service/ami-windows-latest/... points at.
WINDOWS_RELEASES = [
    ("2025.10.15", "2025-10-15T21:08:52.000Z"),
    ("2025.11.12", "2025-11-12T20:34:17.000Z"),
]

# Windows Server versions with EKS-optimized (Core) images.
WINDOWS_VERSIONS = ["2019", "2022", "2025"]

# AL2023 variants per architecture.
AL2023_VARIANTS = {
    "x86_64": ["standard", "nvidia", "neuron"],
    "arm64": ["standard", "nvidia"],
}

# AL2 SSM family -> (architecture, infix of the image name).
AL2_FAMILIES = {
    "amazon-linux-2": ("x86_64", ""),
    "amazon-linux-2-arm64": ("arm64", "arm64-"),
    "amazon-linux-2-gpu": ("x86_64", "gpu-"),
}

EKS_PREFIX = "/aws/service/eks/optimized-ami"
BOTTLEROCKET_PREFIX = "/aws/service/bottlerocket"
WINDOWS_PREFIX = "/aws/service/ami-windows-latest"


def ami_id(name: str) -> str:
    """A stable, realistic-looking image id derived from the image name."""
    return "ami-" + hashlib.sha256(name.encode()).hexdigest()[:17]


def _image(name, arch, description, created, boot_mode, params, owner=OWNER_ID, platform=None):
    return {
        "name": name,
        "architecture": arch,
        "description": description,
        "creation_date": created,
        "boot_mode": boot_mode,
        "owner": owner,
        "platform": platform,
        "ssm": params,
    }


def windows_image_name(version: str, k8s: str, release: str) -> str:
    """e.g. Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12"""
    return f"Windows_Server-{version}-English-Core-EKS_Optimized-{k8s}-{release}"


def images(eks_releases: list[tuple[str, str]] = EKS_RELEASES) -> list[dict]:
    """All images, each with the SSM parameters ({name: value}) that point at it.

    eks_releases (oldest first; the last one is "recommended") defaults to the
    catalog's; the emulator passes a longer list to publish a newer release.
    """
    out = []
    for k8s in K8S_MINORS:
        patch = K8S_PATCH[k8s]
        for i, (release, created) in enumerate(eks_releases):
            latest = i == len(eks_releases) - 1
            date = release[1:]
            release_version = f"{patch}-{date}"

            # Amazon Linux 2023
            for arch, variants in AL2023_VARIANTS.items():
                for variant in variants:
                    name = f"amazon-eks-node-al2023-{arch}-{variant}-{k8s}-{release}"
                    base = f"{EKS_PREFIX}/{k8s}/amazon-linux-2023/{arch}/{variant}"
                    params = {f"{base}/{name}/image_id": ami_id(name)}
                    if latest:
                        params[f"{base}/recommended/image_id"] = ami_id(name)
                        params[f"{base}/recommended/image_name"] = name
                        params[f"{base}/recommended/release_version"] = release_version
                    extra = {"nvidia": ", nvidia", "neuron": ", neuron"}.get(variant, "")
                    desc = (
                        "EKS-optimized Kubernetes node based on Amazon Linux 2023, "
                        f"(k8s: {patch}, containerd: 2.1.*{extra})"
                    )
                    boot = "uefi" if arch == "arm64" else "uefi-preferred"
                    out.append(_image(name, arch, desc, created, boot, params))

            # Amazon Linux 2
            for family, (arch, infix) in AL2_FAMILIES.items():
                name = f"amazon-eks-{infix}node-{k8s}-{release}"
                base = f"{EKS_PREFIX}/{k8s}/{family}"
                params = {f"{base}/{name}/image_id": ami_id(name)}
                if latest:
                    params[f"{base}/recommended/image_id"] = ami_id(name)
                    params[f"{base}/recommended/image_name"] = name
                    params[f"{base}/recommended/release_version"] = release_version
                kind = {"": "", "arm64-": "arm64 ", "gpu-": "GPU "}[infix]
                desc = (
                    f"EKS Kubernetes Worker AMI with AmazonLinux2 {kind}image, "
                    f"(k8s: {patch}, containerd: 1.7.*)"
                )
                boot = "uefi" if arch == "arm64" else "legacy-bios"
                out.append(_image(name, arch, desc, created, boot, params))

        # Bottlerocket
        for i, (version, build, created) in enumerate(BOTTLEROCKET_RELEASES):
            latest = i == len(BOTTLEROCKET_RELEASES) - 1
            for flavor in ["", "-nvidia"]:
                for arch in ["x86_64", "arm64"]:
                    name = f"bottlerocket-aws-k8s-{k8s}{flavor}-{arch}-v{version}-{build}"
                    base = f"{BOTTLEROCKET_PREFIX}/aws-k8s-{k8s}{flavor}/{arch}"
                    params = {
                        f"{base}/{version}/image_id": ami_id(name),
                        f"{base}/{version}-{build}/image_id": ami_id(name),
                        f"{base}/{version}/image_version": f"{version}-{build}",
                    }
                    if latest:
                        params[f"{base}/latest/image_id"] = ami_id(name)
                        params[f"{base}/latest/image_version"] = f"{version}-{build}"
                    desc = f"bottlerocket-aws-k8s-{k8s}{flavor}-{arch}-v{version}-{build}"
                    boot = "uefi" if arch == "arm64" else "legacy-bios"
                    out.append(_image(name, arch, desc, created, boot, params))

        # Windows Server (Core), x86_64 only
        for i, (release, created) in enumerate(WINDOWS_RELEASES):
            latest = i == len(WINDOWS_RELEASES) - 1
            for version in WINDOWS_VERSIONS:
                name = windows_image_name(version, k8s, release)
                params = {}
                if latest:
                    family = f"Windows_Server-{version}-English-Core-EKS_Optimized-{k8s}"
                    params[f"{WINDOWS_PREFIX}/{family}/image_id"] = ami_id(name)
                desc = (
                    f"Microsoft Windows Server {version} Core optimized for EKS "
                    f"(k8s: {patch}, containerd: 1.7.*) and provided by Amazon"
                )
                out.append(_image(name, "x86_64", desc, created, "legacy-bios", params,
                                  owner=WINDOWS_OWNER_ID, platform="windows"))
    return out


def ssm_parameters() -> dict[str, str]:
    """Every public SSM parameter of the catalog, name -> value."""
    params: dict[str, str] = {}
    for img in images():
        for key, value in img["ssm"].items():
            if key in params and params[key] != value:
                raise ValueError(f"conflicting SSM parameter {key}")
            params[key] = value
    return params


def eks_release_images(release: str, created: str) -> list[dict]:
    """The AL2 and AL2023 images of EKS release `release` (e.g. "v20251201"), as
    if it were published after the catalog's releases: their "recommended"
    parameters point at them. A release of the catalog keeps its own date."""
    known = dict(EKS_RELEASES)
    releases = [r for r in EKS_RELEASES if r[0] != release]
    releases.append((release, known.get(release, created)))
    return [img for img in images(releases) if img["name"].endswith(f"-{release}")]


def moto_amis() -> list[dict]:
    """The images in moto's MOTO_AMIS_PATH format (keyword arguments of moto's Ami)."""
    return [moto_ami(img) for img in images()]


def moto_ami(img: dict) -> dict:
    """One image in moto's MOTO_AMIS_PATH format (keyword arguments of moto's Ami).

    Only Windows images get a `platform` ("windows", as EC2 reports it); EC2
    reports none for Linux images, and neither does moto's Ami without one.
    """
    ami = {
        "ami_id": ami_id(img["name"]),
        "name": img["name"],
        "description": img["description"],
        "owner_id": img["owner"],
        "public": True,
        "state": "available",
        "architecture": img["architecture"],
        "virtualization_type": "hvm",
        "hypervisor": "xen",
        "image_type": "machine",
        "image_location": f"amazon/{img['name']}",
        "root_device_type": "ebs",
        "root_device_name": "/dev/xvda",
        "sriov": "simple",
        "boot_mode": img["boot_mode"],
        "creation_date": img["creation_date"],
    }
    if img["platform"]:
        ami["platform"] = img["platform"]
    if img["platform"] == "windows":
        ami["root_device_name"] = "/dev/sda1"
    return ami


def amis_json() -> str:
    return json.dumps(moto_amis(), indent=1, sort_keys=True) + "\n"


AMIS_PATH = Path(__file__).resolve().parent / "amis.json"


def check(path: Path = AMIS_PATH) -> bool:
    try:
        return path.read_text(encoding="utf-8") == amis_json()
    except FileNotFoundError:
        return False


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        AMIS_PATH.write_text(amis_json(), encoding="utf-8")
        print(f"wrote {len(moto_amis())} images to {AMIS_PATH.name}", file=sys.stderr)
        return 0
    if argv == ["--check"]:
        if check():
            return 0
        print(f"{AMIS_PATH.name} is stale: run hack/moto/eks_images.py --write", file=sys.stderr)
        return 1
    if argv == ["--ssm"]:
        for key, value in sorted(ssm_parameters().items()):
            print(f"{key}\t{value}")
        return 0
    print("usage: eks_images.py --write | --check | --ssm", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
