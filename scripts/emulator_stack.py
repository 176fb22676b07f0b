#!/usr/bin/env python3
"""The CDK app's synthesized template, deployed into the AWS emulator (moto) through its
CloudFormation, for the emulator flow of docs/operations.md §10.

    emulator_stack.py derive TEMPLATE OUT          the emulator template (stdlib only)
    emulator_stack.py deploy --template T --stack-name NAME --outputs FILE [--assets CDK_OUT]
                                                   needs boto3 (moto's venv) and AWS_ENDPOINT_URL

`derive` keeps every resource whose type moto's CloudFormation creates (KEPT) and strips, by an
explicit list with the reason for each (STRIPPED), what it cannot create or what would act in
the emulator instead of the process that stands in for it; a type on neither list stops it.
What else it changes is in ADAPTED; all of it is printed. `deploy` does what `cdk bootstrap`
and `cdk deploy` would: the bootstrap version parameter, the assets bucket and the file assets,
CreateStack (and a check that moto created every resource: it skips a type it does not know
with a log line), then the bucket notifications of the stripped custom resource (their Lambda
destination replaced by the upload-events queue the template gains) and the bucket settings moto's
CloudFormation ignores, and writes the stack's Outputs in `cdk deploy --outputs-file` form.
"""

import argparse
import copy
import json
import os
import sys
import time

# Types moto's CloudFormation creates, and what the emulator flow gets from each.
KEPT = {
    "AWS::S3::Bucket": "buckets, named by CloudFormation (moto's CloudFormation applies encryption and tags; `deploy` "
    "applies versioning and Object Lock, see BUCKET_SETTINGS)",
    "AWS::SQS::Queue": "queues with their attributes and redrive policies",
    "AWS::StepFunctions::StateMachine": "the bulk workflow's state machine, its definition as synthesized",
    "AWS::Lambda::Function": "functions from the published assets (created, never run: moto runs Lambda only in Docker)",
    "AWS::Lambda::Permission": "invoke permissions (not enforced)",
    "AWS::IAM::Role": "roles (not enforced)",
    "AWS::IAM::Policy": "identity policies (not enforced)",
    "AWS::IAM::InstanceProfile": "the hosts' instance profile",
    "AWS::Logs::LogGroup": "log groups",
    "AWS::SNS::Topic": "the alarm topic",
    "AWS::Events::Rule": "the rotation schedule (moto does not fire it)",
    "AWS::CloudWatch::Dashboard": "the dashboard",
    "AWS::EC2::VPC": "the VPC",
    "AWS::EC2::Subnet": "subnets",
    "AWS::EC2::RouteTable": "route tables",
    "AWS::EC2::SubnetRouteTableAssociation": "route table associations",
    "AWS::EC2::SecurityGroup": "security groups",
    "AWS::EC2::SecurityGroupIngress": "security group rules",
    "AWS::EC2::VPCEndpoint": "VPC endpoints (no traffic goes through them)",
    "AWS::EC2::FlowLog": "the VPC flow log",
    "AWS::EC2::LaunchTemplate": "the hosts' launch template (Nitro Enclaves option recorded, not run)",
    "AWS::AutoScaling::AutoScalingGroup": "the Auto Scaling group (moto starts fake instances that run nothing)",
}

# Types left out of the emulator template, and why. Each is listed in docs/operations.md §10.
STRIPPED = {
    "AWS::KMS::Key": "the emulator flow's KMS is the local KMS (moto's answers Recipient with plaintext, has no "
    "GenerateDataKeyPair and no Ed25519 signing key); moto's CloudFormation also fails on a key's Tags",
    "AWS::Lambda::EventSourceMapping": "moto would receive the queue's messages itself and invoke the function in "
    "Docker on each; `dev aws-pump` is the event source here",
    "Custom::S3BucketNotifications": "a Lambda-backed custom resource moto cannot run: `deploy` applies its "
    "notification configuration itself, to the upload-events queue instead of on-upload",
    "AWS::Lambda::EventInvokeConfig": "not in moto's CloudFormation (on-upload's retries and on-failure destination: "
    "`dev aws-pump` retries and calls job-dead-letter)",
    "AWS::AutoScaling::LifecycleHook": "not in moto's CloudFormation (the launch and drain hooks)",
    "AWS::AutoScaling::ScalingPolicy": "not in moto's CloudFormation (backlog-per-host scaling)",
    "AWS::CloudWatch::Alarm": "not in moto's CloudFormation",
    "AWS::S3::BucketPolicy": "not in moto's CloudFormation (and moto enforces no bucket policy)",
    "AWS::SQS::QueuePolicy": "not in moto's CloudFormation (and moto enforces no queue policy)",
    "AWS::SNS::TopicPolicy": "not in moto's CloudFormation",
}

# What `derive` changes besides leaving types out.
ADAPTED = {
    "fifo-queue-names": "a FIFO queue without QueueName gets `<stack>-<logical id>.fifo`: moto's generated names lack "
    "the `.fifo` CloudFormation appends, and moto then refuses the queue",
    "upload-events-queue": "an SQS queue UploadEvents (output UploadEventsQueueUrl) that the jobs bucket notifies in "
    "place of on-upload; `dev aws-pump` hands its events to the real handler",
    "references-to-stripped": "a reference from a kept resource to a stripped one becomes the string "
    "`stripped:<logical id>` (a Lambda environment variable naming a KMS key: nothing runs those functions)",
    "definition-substitutions": "a state machine's DefinitionSubstitutions are written into its DefinitionString "
    "(as CloudFormation does; moto's CloudFormation ignores them and would leave the `${...}` placeholders)",
    "outputs-of-stripped": "an output naming a stripped resource is left out (FleetKeyArn, ModelKeyArn, "
    "LedgerSigningKeyArn: the flow's keys are the local KMS's, and the ledger's checkpoints are signed by a "
    "development key)",
}

# Bucket properties moto's CloudFormation ignores that `deploy` applies through the S3 API; the
# others it ignores (lifecycle rules, access logging, public access block, ownership controls)
# change nothing the emulator flow can observe and are left out (docs/operations.md §10).
BUCKET_SETTINGS = ("VersioningConfiguration", "ObjectLockEnabled", "ObjectLockConfiguration")

UPLOAD_EVENTS = "UploadEvents"
UPLOAD_EVENTS_OUTPUT = "UploadEventsQueueUrl"
NOTIFICATIONS_TYPE = "Custom::S3BucketNotifications"
STRIPPED_PREFIX = "stripped:"


class DeriveError(Exception):
    pass


def referenced(value):
    """Logical ids a template value names with Ref or Fn::GetAtt (pseudo parameters included)."""
    found = set()
    if isinstance(value, dict):
        if isinstance(value.get("Ref"), str):
            found.add(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            found.add(target[0] if isinstance(target, list) else str(target).split(".")[0])
        if isinstance(value.get("Fn::Sub"), (str, list)):
            text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
            for part in text.split("${")[1:]:
                found.add(part.split("}")[0].split(".")[0])
        for item in value.values():
            found |= referenced(item)
    elif isinstance(value, list):
        for item in value:
            found |= referenced(item)
    return found


def replace_references(value, stripped, replaced, where):
    """`value` with every Ref/GetAtt of a stripped resource replaced by `stripped:<id>`."""
    if isinstance(value, dict):
        if len(value) == 1 and ("Ref" in value or "Fn::GetAtt" in value) and referenced(value) & stripped:
            (name,) = referenced(value)
            replaced.append((where, name))
            return STRIPPED_PREFIX + name
        if "Fn::Sub" in value and referenced({"Fn::Sub": value["Fn::Sub"]}) & stripped:
            raise DeriveError(f"{where}: Fn::Sub names a stripped resource ({sorted(referenced(value) & stripped)})")
        return {k: replace_references(v, stripped, replaced, f"{where}/{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [replace_references(v, stripped, replaced, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def substitute(value, substitutions):
    """A DefinitionString (a string, or an Fn::Join of strings and intrinsics) with each
    `${Name}` of `substitutions` replaced by its value: an Fn::Join when a value is an intrinsic."""
    if isinstance(value, dict) and set(value) == {"Fn::Join"} and value["Fn::Join"][0] == "":
        parts = []
        for item in value["Fn::Join"][1]:
            done = substitute(item, substitutions)
            parts += done["Fn::Join"][1] if isinstance(done, dict) and "Fn::Join" in done else [done]
        return {"Fn::Join": ["", parts]}
    if not isinstance(value, str):
        return value
    parts = [value]
    for name, replacement in substitutions.items():
        marker = "${" + name + "}"
        next_parts = []
        for part in parts:
            if not isinstance(part, str):
                next_parts.append(part)
                continue
            pieces = part.split(marker)
            for i, piece in enumerate(pieces):
                if i:
                    next_parts.append(replacement)
                next_parts.append(piece)
        parts = [p for p in next_parts if p != ""]
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return {"Fn::Join": ["", parts]}


def derive(template):
    """(emulator template, report). The report lists what was stripped, adapted and dropped."""
    template = copy.deepcopy(template)
    resources = template.get("Resources", {})
    unknown = sorted({r["Type"] for r in resources.values() if r["Type"] not in KEPT and r["Type"] not in STRIPPED})
    if unknown:
        raise DeriveError(
            "resource types on neither list of scripts/emulator_stack.py: " + ", ".join(unknown)
            + " — find out whether moto's CloudFormation creates them (KEPT) or not (STRIPPED, with the reason)")
    if UPLOAD_EVENTS in resources or UPLOAD_EVENTS_OUTPUT in template.get("Outputs", {}):
        raise DeriveError(f"the template already has {UPLOAD_EVENTS}: the emulator's upload-events queue needs another name")
    stripped = {name for name, r in resources.items() if r["Type"] in STRIPPED}
    report = {"kept": {}, "stripped": {}, "adapted": [], "references": [], "outputs_dropped": [], "notifications": [],
              "bucket_settings": {}}
    for name, resource in sorted(resources.items()):
        side = "stripped" if name in stripped else "kept"
        report[side].setdefault(resource["Type"], []).append(name)

    kept = {}
    for name, resource in resources.items():
        if name in stripped:
            if resource["Type"] == NOTIFICATIONS_TYPE:
                report["notifications"].append({"logical_id": name, "properties": resource.get("Properties", {})})
            continue
        resource = dict(resource)
        depends = resource.get("DependsOn")
        if depends is not None:
            depends = [depends] if isinstance(depends, str) else list(depends)
            left = [d for d in depends if d not in stripped]
            if left:
                resource["DependsOn"] = left
            else:
                del resource["DependsOn"]
        replaced = []
        resource = replace_references(resource, stripped, replaced, name)
        report["references"] += [{"in": where, "to": to} for where, to in replaced]
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::SQS::Queue" and props.get("FifoQueue") in (True, "true") and "QueueName" not in props:
            suffix = f"-{name}"[:75] + ".fifo"
            resource["Properties"] = {**props, "QueueName": {"Fn::Join": ["", [{"Ref": "AWS::StackName"}, suffix]]}}
            report["adapted"].append({"what": "fifo-queue-names", "logical_id": name})
        if resource["Type"] == "AWS::StepFunctions::StateMachine" and "DefinitionSubstitutions" in props:
            props = dict(resource["Properties"])
            substitutions = props.pop("DefinitionSubstitutions")
            props["DefinitionString"] = substitute(props["DefinitionString"], substitutions)
            resource["Properties"] = props
            report["adapted"].append({"what": "definition-substitutions", "logical_id": name})
        if resource["Type"] == "AWS::S3::Bucket":
            settings = {k: v for k, v in props.items() if k in BUCKET_SETTINGS}
            if settings:
                report["bucket_settings"][name] = settings
        kept[name] = resource

    kept[UPLOAD_EVENTS] = {"Type": "AWS::SQS::Queue", "Properties": {"MessageRetentionPeriod": 1209600}}
    report["adapted"].append({"what": "upload-events-queue", "logical_id": UPLOAD_EVENTS})
    template["Resources"] = kept

    outputs = {}
    for name, output in template.get("Outputs", {}).items():
        if referenced(output) & stripped:
            report["outputs_dropped"].append(name)
            continue
        outputs[name] = output
    outputs[UPLOAD_EVENTS_OUTPUT] = {
        "Description": "the emulator's stand-in for on-upload: the jobs bucket's upload events (dev aws-pump)",
        "Value": {"Ref": UPLOAD_EVENTS},
    }
    template["Outputs"] = outputs
    if not report["notifications"]:
        raise DeriveError(f"the template has no {NOTIFICATIONS_TYPE}: nothing would turn an upload into a job")
    return template, report


def print_report(report, out=sys.stderr):
    for kind, title in (("kept", "created by moto's CloudFormation"), ("stripped", "stripped")):
        total = sum(len(v) for v in report[kind].values())
        print(f"{title}: {total} resources", file=out)
        for rtype in sorted(report[kind]):
            reason = KEPT.get(rtype) if kind == "kept" else STRIPPED.get(rtype)
            print(f"  {len(report[kind][rtype]):3} {rtype}: {reason}", file=out)
    for what, reason in ADAPTED.items():
        names = [item["logical_id"] for item in report["adapted"] if item["what"] == what]
        if names:
            print(f"adapted: {', '.join(names)}: {reason}", file=out)
    for name, settings in sorted(report["bucket_settings"].items()):
        print(f"bucket settings applied after creation: {name}: {', '.join(sorted(settings))}", file=out)
    for item in report["references"]:
        print(f"reference to stripped {item['to']} in {item['in']} -> {STRIPPED_PREFIX}{item['to']}", file=out)
    if report["outputs_dropped"]:
        print(f"outputs left out (they name stripped resources): {', '.join(report['outputs_dropped'])}", file=out)


# ---------------------------------------------------------------------------------------------
# deploy (boto3)


def _clients():
    import boto3  # moto's venv has it (scripts/moto.sh install)

    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if not endpoint:
        raise SystemExit("AWS_ENDPOINT_URL is not set: this deploys into the AWS emulator only (scripts/moto.sh start)")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    session = boto3.session.Session(region_name=region)

    def client(service):
        return session.client(service, endpoint_url=endpoint)

    return client, region


def _sub(text, account, region):
    return text.replace("${AWS::AccountId}", account).replace("${AWS::Region}", region).replace("${AWS::Partition}", "aws")


def cdk_bootstrap(client, template, assets_dir, stack, account, region):
    """The part of `cdk bootstrap` + asset publishing the template uses: the version parameter
    and the file assets in the assets bucket."""
    parameter = template.get("Parameters", {}).get("BootstrapVersion")
    if parameter and str(parameter.get("Type", "")).startswith("AWS::SSM::Parameter::Value"):
        # Any version the template's CheckBootstrapVersion rule accepts (6 or later).
        client("ssm").put_parameter(Name=parameter["Default"], Value="30", Type="String", Overwrite=True)
    manifest_path = os.path.join(assets_dir, f"{stack}.assets.json")
    if not os.path.exists(manifest_path):
        raise SystemExit(f"no asset manifest {manifest_path} beside the synthesized template")
    with open(manifest_path) as f:
        manifest = json.load(f)
    s3 = client("s3")
    made = set()
    for asset in manifest.get("files", {}).values():
        source = os.path.join(assets_dir, asset["source"]["path"])
        if asset["source"].get("packaging", "file") != "file":
            raise SystemExit(f"asset {source}: only file assets are published here (packaging {asset['source']['packaging']})")
        for destination in asset["destinations"].values():
            bucket = _sub(destination["bucketName"], account, region)
            if bucket not in made:
                try:
                    if region == "us-east-1":
                        s3.create_bucket(Bucket=bucket)
                    else:
                        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
                except s3.exceptions.BucketAlreadyOwnedByYou:
                    pass
                made.add(bucket)
            with open(source, "rb") as f:
                s3.put_object(Bucket=bucket, Key=destination["objectKey"], Body=f.read())


def apply_notifications(client, notifications, physical, upload_events_arn):
    """What CDK's BucketNotificationsHandler does with the custom resource's properties
    (PutBucketNotificationConfiguration), with each Lambda destination replaced by the
    upload-events queue."""
    s3 = client("s3")
    applied = []
    for item in notifications:
        props = item["properties"]
        bucket_ref = props.get("BucketName")
        names = referenced(bucket_ref)
        if not (isinstance(bucket_ref, dict) and len(names) == 1 and next(iter(names)) in physical):
            raise SystemExit(f"{item['logical_id']}: BucketName {bucket_ref!r} is not a bucket of the stack")
        bucket = physical[next(iter(names))]
        config = props.get("NotificationConfiguration", {})
        queues = []
        for i, lam in enumerate(config.get("LambdaFunctionConfigurations", [])):
            entry = {"Id": f"on-upload-{i}", "QueueArn": upload_events_arn, "Events": lam["Events"]}
            if "Filter" in lam:
                entry["Filter"] = lam["Filter"]
            queues.append(entry)
        for other in ("QueueConfigurations", "TopicConfigurations", "EventBridgeConfiguration"):
            if config.get(other):
                raise SystemExit(f"{item['logical_id']}: {other} in the template's notifications is not handled here")
        s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"QueueConfigurations": queues})
        applied.append({"bucket": bucket, "filters": [q.get("Filter") for q in queues]})
    return applied


def apply_bucket_settings(client, bucket_settings, physical):
    """Versioning and Object Lock as the template sets them (moto's CloudFormation ignores both)."""
    s3 = client("s3")
    for name, settings in sorted(bucket_settings.items()):
        bucket = physical[name]
        versioning = settings.get("VersioningConfiguration")
        if versioning:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": versioning["Status"]})
        lock = settings.get("ObjectLockConfiguration")
        if settings.get("ObjectLockEnabled") in (True, "true") or lock:
            config = {"ObjectLockEnabled": "Enabled"}
            retention = (lock or {}).get("Rule", {}).get("DefaultRetention")
            if retention:
                config["Rule"] = {"DefaultRetention": {k: (int(v) if k in ("Days", "Years") else v) for k, v in retention.items()}}
            s3.put_object_lock_configuration(Bucket=bucket, ObjectLockConfiguration=config)


def deploy(args):
    with open(args.template) as f:
        synthesized = json.load(f)
    template, report = derive(synthesized)
    print_report(report)
    client, region = _clients()
    account = client("sts").get_caller_identity()["Account"]
    started = time.monotonic()
    cfn = client("cloudformation")
    try:
        existing = [s for s in cfn.describe_stacks(StackName=args.stack_name)["Stacks"] if s["StackStatus"] != "DELETE_COMPLETE"]
    except cfn.exceptions.ClientError as e:
        if "does not exist" not in str(e):
            raise
        existing = []
    if existing:
        # Kept as it is (a second run is a no-op); to deploy a changed template, use another name.
        print(f"stack {args.stack_name} exists ({existing[0]['StackStatus']}): kept, its outputs written again", file=sys.stderr)
    else:
        cdk_bootstrap(client, template, args.assets, args.manifest_stack, account, region)
        cfn.create_stack(StackName=args.stack_name, TemplateBody=json.dumps(template),
                         Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"])
    deadline = time.monotonic() + args.timeout
    while True:
        stack = cfn.describe_stacks(StackName=args.stack_name)["Stacks"][0]
        if not stack["StackStatus"].endswith("_IN_PROGRESS"):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"stack {args.stack_name} still {stack['StackStatus']} after {args.timeout}s")
        time.sleep(0.5)
    if stack["StackStatus"] != "CREATE_COMPLETE":
        events = cfn.describe_stack_events(StackName=args.stack_name)["StackEvents"]
        failed = [f"{e['LogicalResourceId']} {e['ResourceStatus']}: {e.get('ResourceStatusReason')}" for e in events
                  if e["ResourceStatus"].endswith("FAILED")]
        raise SystemExit(f"stack {args.stack_name}: {stack['StackStatus']}\n" + "\n".join(failed[:20]))
    # moto skips a type it does not know with no more than a log line: every resource must be there.
    created = {}
    for page in cfn.get_paginator("list_stack_resources").paginate(StackName=args.stack_name):
        for r in page["StackResourceSummaries"]:
            created[r["LogicalResourceId"]] = r
    missing = sorted(set(template["Resources"]) - set(created))
    not_complete = sorted(n for n, r in created.items() if r["ResourceStatus"] != "CREATE_COMPLETE")
    if missing or not_complete:
        raise SystemExit(
            "moto's CloudFormation did not create: "
            + ", ".join(f"{n} ({template['Resources'][n]['Type']})" for n in missing)
            + (f"; not complete: {', '.join(not_complete)}" if not_complete else ""))
    physical = {n: r["PhysicalResourceId"] for n, r in created.items()}
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    missing_outputs = sorted(set(template["Outputs"]) - set(outputs))
    if missing_outputs:
        raise SystemExit(f"stack {args.stack_name} lacks the template's outputs {', '.join(missing_outputs)}")
    sqs = client("sqs")
    events_arn = sqs.get_queue_attributes(QueueUrl=outputs[UPLOAD_EVENTS_OUTPUT], AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    apply_bucket_settings(client, report["bucket_settings"], physical)
    applied = apply_notifications(client, report["notifications"], physical, events_arn)
    for item in applied:
        print(f"notifications of s3://{item['bucket']} -> {UPLOAD_EVENTS}: {json.dumps(item['filters'])}", file=sys.stderr)
    with open(args.outputs, "w") as f:
        json.dump({args.stack_name: outputs}, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"stack {args.stack_name}: {len(created)} resources in {time.monotonic() - started:.1f}s; outputs in {args.outputs}",
          file=sys.stderr)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("derive", help="write the emulator template and print what changed")
    d.add_argument("template")
    d.add_argument("out")
    p = sub.add_parser("deploy", help="create the emulator template's stack in moto and write its outputs")
    p.add_argument("--template", required=True, help="the synthesized template (cdk.out/<stack>.template.json)")
    p.add_argument("--assets", help="the cloud assembly directory holding <stack>.assets.json (default: the template's)")
    p.add_argument("--manifest-stack", default="EphemBatch", help="the synthesized stack's name (its asset manifest)")
    p.add_argument("--stack-name", required=True)
    p.add_argument("--outputs", required=True, help="where to write the outputs (cdk deploy --outputs-file form)")
    p.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    try:
        if args.command == "derive":
            with open(args.template) as f:
                template, report = derive(json.load(f))
            print_report(report)
            with open(args.out, "w") as f:
                json.dump(template, f, indent=1)
                f.write("\n")
        else:
            args.assets = args.assets or os.path.dirname(os.path.abspath(args.template))
            deploy(args)
    except DeriveError as e:
        raise SystemExit(f"emulator_stack: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
