#!/usr/bin/env bash
# Tells the controller (aws provider, on the AWS emulator) that something is happening to a
# NodeClaim's instance, the way EC2 would: an EventBridge event sent to the interruption queue
# the emulator seeds for the cluster, or a failed status check.
#
#   hack/interrupt.sh NODECLAIM [spot|rebalance|stopping|terminated|impaired]
#
# spot (default)  EC2 Spot Instance Interruption Warning
# rebalance       EC2 Instance Rebalance Recommendation
# stopping        EC2 Instance State-change Notification, state stopping
# terminated      EC2 Instance State-change Notification, state terminated
# impaired        the instance's system status check failed 10 minutes ago (DescribeInstanceStatus;
#                 the controller reads the checks every minute)
#
# Environment: CLUSTER_NAME (default karpenter-demo; also the queue's name), MOTO_PORT,
# AWS_REGION, KUBECONFIG.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

claim=${1:-}
what=${2:-spot}
[[ -n $claim ]] || die "usage: $0 NODECLAIM [spot|rebalance|stopping|terminated|impaired]"
case "$what" in spot | rebalance | stopping | terminated | impaired) ;; *) die "unknown event $what" ;; esac
export KUBECONFIG=${KUBECONFIG:-$KRS_KUBECONFIG}
provider_id=$(kubectl get nodeclaim "$claim" -o jsonpath='{.status.providerID}')
[[ $provider_id == aws:///* ]] || die "NodeClaim $claim has no EC2 instance (providerID '$provider_id')"
instance=${provider_id##*/}
endpoint=${AWS_ENDPOINT_URL:-http://127.0.0.1:${MOTO_PORT:-14566}}
python=$("$HACK_DIR/moto-up.sh" --venv)/bin/python

if [[ $what == impaired ]]; then
  since=$("$python" -c 'import datetime as d; print((d.datetime.now(d.timezone.utc) - d.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ"))')
  curl -fsS -X POST "$endpoint/_karpenter-rs/instance-status" -H 'Content-Type: application/json' \
    -d "{\"instance_id\": \"$instance\", \"check\": \"system\", \"status\": \"impaired\", \"impaired_since\": \"$since\"}" >/dev/null
  log "interrupt: $instance ($claim): system status check impaired since $since"
  exit 0
fi

AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing} \
  "$python" - "$endpoint" "${AWS_REGION:-us-west-2}" "$CLUSTER_NAME" "$instance" "$what" <<'PY'
import datetime, json, sys, uuid
import boto3

endpoint, region, queue, instance, what = sys.argv[1:]
detail_type, detail = {
    "spot": ("EC2 Spot Instance Interruption Warning", {"instance-action": "terminate"}),
    "rebalance": ("EC2 Instance Rebalance Recommendation", {}),
    "stopping": ("EC2 Instance State-change Notification", {"state": "stopping"}),
    "terminated": ("EC2 Instance State-change Notification", {"state": "terminated"}),
}[what]
event = {
    "version": "0", "id": str(uuid.uuid4()), "detail-type": detail_type, "source": "aws.ec2",
    "account": "123456789012", "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "region": region, "resources": [f"arn:aws:ec2:{region}:123456789012:instance/{instance}"],
    "detail": {"instance-id": instance, **detail},
}
sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=region)
url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
sqs.send_message(QueueUrl=url, MessageBody=json.dumps(event))
print(f"sent {detail_type} for {instance} to {url}", file=sys.stderr)
PY
