#!/usr/bin/env python3
"""Regenerates src/cloudprovider/aws/data/instance-types-us-east-1.json, the
instance-type catalog embedded in the binary (see
src/cloudprovider/aws/embedded.rs).

The source is the EC2 DescribeInstanceTypes and DescribeInstanceTypeOfferings
snapshot that moto (Apache-2.0) bundles. Run it with the Python of the moto
venv:

    "$(hack/moto-up.sh --venv)/bin/python" hack/gen-instance-types.py

Only what karpenter-rs's TypeInfo reads is kept, with the same filters as the
live catalog (x86_64 or arm64, HVM), and only the zones listed in ZONES. Fields
at their default (false, 0, absent, empty) are left out. The output is sorted
and has one type per line, so a regeneration diffs well. Prices are not part of
the file: they come from the on-demand price table already in the repository.
"""

import gzip
import json
import os
import sys

import moto

REGION = "us-east-1"
ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "src",
    "cloudprovider",
    "aws",
    "data",
    f"instance-types-{REGION}.json",
)


def load(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def default_network_card(net):
    """The default network card: the one with the default index, else the one at that position."""
    index = net.get("DefaultNetworkCardIndex", 0)
    cards = net.get("NetworkCards", [])
    for card in cards:
        if card.get("NetworkCardIndex") == index:
            return card
    return cards[index] if 0 <= index < len(cards) else None


def type_info(t):
    """The fields TypeInfo::from_sdk reads, under TypeInfo's field names."""
    proc = t.get("ProcessorInfo", {})
    net = t.get("NetworkInfo", {})
    out = {
        "name": t["InstanceType"],
        "architectures": proc.get("SupportedArchitectures", []),
        "vcpus": t["VCpuInfo"]["DefaultVCpus"],
        "memory_mib": t["MemoryInfo"]["SizeInMiB"],
        "hypervisor": t.get("Hypervisor", ""),
        "cpu_manufacturer": proc.get("Manufacturer"),
        "sustained_clock_ghz": proc.get("SustainedClockSpeedInGhz"),
        "max_enis": net.get("MaximumNetworkInterfaces", 0),
        "ipv4_per_eni": net.get("Ipv4AddressesPerInterface", 0),
        "encryption_in_transit": net.get("EncryptionInTransitSupported", False),
        "gpus": [
            {
                "name": g.get("Name", ""),
                "manufacturer": g.get("Manufacturer", ""),
                "count": g.get("Count", 0),
                "memory_mib": g.get("MemoryInfo", {}).get("SizeInMiB", 0),
            }
            for g in t.get("GpuInfo", {}).get("Gpus", [])
        ],
        "efa_interfaces": net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0),
        "spot_supported": "spot" in t.get("SupportedUsageClasses", []),
    }
    neuron = t.get("NeuronInfo", {}).get("NeuronDevices", [])
    if neuron:
        out["accelerators"] = [
            {
                "name": d.get("Name", ""),
                "manufacturer": "AWS",
                "count": d.get("Count", 0),
                "cores": d.get("CoreInfo", {}).get("Count", 0),
            }
            for d in neuron
        ]
    else:
        out["accelerators"] = [
            {"name": a.get("Name", ""), "manufacturer": a.get("Manufacturer", ""), "count": a.get("Count", 0)}
            for a in t.get("InferenceAcceleratorInfo", {}).get("Accelerators", [])
        ]
    storage = t.get("InstanceStorageInfo")
    if storage and storage.get("NvmeSupport", "unsupported") != "unsupported":
        out["local_nvme_gb"] = storage.get("TotalSizeInGB")
    cards = net.get("NetworkCards", [])
    if cards and cards[0].get("BaselineBandwidthInGbps") is not None:
        out["network_bandwidth_mbps"] = round(cards[0]["BaselineBandwidthInGbps"] * 1000)
    # Only types whose default card has fewer interfaces than the whole instance (those with
    # several network cards) carry the field; elsewhere TypeInfo falls back to max_enis.
    default_card = default_network_card(net)
    if default_card is not None:
        card_enis = default_card.get("MaximumNetworkInterfaces")
        if card_enis is not None and card_enis != out["max_enis"]:
            out["default_card_max_enis"] = card_enis
    # Per-card interface limits only for types with several cards (TypeInfo::card_interfaces
    # falls back to the default card's for the others).
    if len(cards) > 1:
        by_index = sorted((c.get("NetworkCardIndex", 0), c.get("MaximumNetworkInterfaces", 0)) for c in cards)
        out["network_cards"] = [enis for _, enis in by_index]
    out["ena_unsupported"] = net.get("EnaSupport") == "unsupported"
    strategies = t.get("PlacementGroupInfo", {}).get("SupportedStrategies", [])
    if strategies and not {"cluster", "partition", "spread"} <= set(strategies):
        out["placement_strategies"] = strategies
    out["nested_virtualization"] = "nested-virtualization" in proc.get("SupportedFeatures", [])
    ebs = t.get("EbsInfo", {}).get("EbsOptimizedInfo", {}).get("MaximumBandwidthInMbps")
    if ebs is not None:
        out["ebs_bandwidth_mbps"] = ebs
    return {k: v for k, v in out.items() if v not in (None, False, 0, "", [])}


def main():
    resources = os.path.join(os.path.dirname(moto.__file__), "ec2", "resources")
    types = load(os.path.join(resources, "instance_types.json.gz"))
    offerings = load(os.path.join(resources, "instance_type_offerings", "availability-zone", f"{REGION}.json.gz"))
    zones = {}
    for o in offerings:
        if o["Location"] in ZONES:
            zones.setdefault(o["InstanceType"], set()).add(o["Location"])
    rows = []
    for name in sorted(zones):
        t = types.get(name)
        if t is None:
            continue
        archs = t.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
        if not ({"x86_64", "arm64"} & set(archs)):
            continue
        if "hvm" not in t.get("SupportedVirtualizationTypes", []):
            continue
        info = type_info(t)
        info["zones"] = sorted(zones[name])
        rows.append(json.dumps(info, sort_keys=True, separators=(",", ":")))
    header = {
        "region": REGION,
        "zones": ZONES,
        "source": f"moto {moto.__version__} DescribeInstanceTypes and DescribeInstanceTypeOfferings",
    }
    with open(OUT, "w") as f:
        f.write("{\n")
        for k, v in header.items():
            f.write(f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))},\n")
        f.write('"types":[\n')
        f.write(",\n".join(rows))
        f.write("\n]}\n")
    print(f"wrote {len(rows)} instance types to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
