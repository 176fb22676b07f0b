"""scripts/emulator_stack.py's `derive`: what the emulator template keeps, strips and changes.

    python3 -m unittest discover -s scripts/tests -p 'test_emulator_stack.py'

Stdlib only (no moto, no boto3): `scripts/test-rust.sh` runs it before the AWS tests deploy the
real template (tests/tests/aws_stack.rs), and the derive of the synthesized template itself.
"""

import copy
import json
import os
import sys
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in scripts/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import emulator_stack as es  # noqa: E402


def template():
    """A small template with the shapes the CDK app synthesizes."""
    return {
        "Parameters": {"BootstrapVersion": {"Type": "AWS::SSM::Parameter::Value<String>", "Default": "/cdk-bootstrap/hnb659fds/version"}},
        "Resources": {
            "Jobs": {"Type": "AWS::S3::Bucket", "Properties": {"BucketEncryption": {}}},
            "Ledger": {
                "Type": "AWS::S3::Bucket",
                "Properties": {
                    "VersioningConfiguration": {"Status": "Enabled"},
                    "ObjectLockEnabled": True,
                    "ObjectLockConfiguration": {"ObjectLockEnabled": "Enabled", "Rule": {"DefaultRetention": {"Days": 30, "Mode": "GOVERNANCE"}}},
                },
            },
            "LedgerPolicy": {"Type": "AWS::S3::BucketPolicy", "Properties": {"Bucket": {"Ref": "Ledger"}}},
            "JobsDlq": {"Type": "AWS::SQS::Queue", "Properties": {}},
            "JobsQueue": {"Type": "AWS::SQS::Queue", "Properties": {"RedrivePolicy": {"deadLetterTargetArn": {"Fn::GetAtt": ["JobsDlq", "Arn"]}, "maxReceiveCount": 5}}},
            "LedgerFifo": {"Type": "AWS::SQS::Queue", "Properties": {"FifoQueue": True}},
            "NamedFifo": {"Type": "AWS::SQS::Queue", "Properties": {"FifoQueue": True, "QueueName": "given.fifo"}},
            "Key": {"Type": "AWS::KMS::Key", "Properties": {"KeyPolicy": {}}},
            "Role": {"Type": "AWS::IAM::Role", "Properties": {}},
            "Fn": {
                "Type": "AWS::Lambda::Function",
                "Properties": {"Role": {"Fn::GetAtt": ["Role", "Arn"]}, "Environment": {"Variables": {"KEY": {"Fn::GetAtt": ["Key", "Arn"]}, "Q": {"Ref": "JobsQueue"}}}},
                "DependsOn": ["Role", "LedgerPolicy"],
            },
            "Mapping": {"Type": "AWS::Lambda::EventSourceMapping", "Properties": {"FunctionName": {"Ref": "Fn"}}},
            "Machine": {
                "Type": "AWS::StepFunctions::StateMachine",
                "Properties": {
                    "DefinitionString": '{"F": "${FnArn}", "B": "${Bucket}", "C": "${...} stays", "G": "${FnArn}"}',
                    "DefinitionSubstitutions": {"FnArn": {"Fn::GetAtt": ["Fn", "Arn"]}, "Bucket": {"Ref": "Jobs"}},
                },
            },
            "Notifications": {
                "Type": "Custom::S3BucketNotifications",
                "Properties": {
                    "BucketName": {"Ref": "Jobs"},
                    "NotificationConfiguration": {"LambdaFunctionConfigurations": [
                        {"Events": ["s3:ObjectCreated:*"], "Filter": {"Key": {"FilterRules": [{"Name": "suffix", "Value": "/input.sealed"}, {"Name": "prefix", "Value": "jobs/"}]}},
                         "LambdaFunctionArn": {"Fn::GetAtt": ["Fn", "Arn"]}}]},
                },
                "DependsOn": ["LedgerPolicy"],
            },
        },
        "Outputs": {
            "JobsBucketName": {"Value": {"Ref": "Jobs"}},
            "FleetKeyArn": {"Value": {"Fn::GetAtt": ["Key", "Arn"]}},
            "JobQueueUrl": {"Value": {"Ref": "JobsQueue"}},
        },
    }


class Derive(unittest.TestCase):
    def setUp(self):
        self.original = template()
        self.derived, self.report = es.derive(self.original)
        self.resources = self.derived["Resources"]

    def test_the_input_is_not_changed(self):
        self.assertEqual(self.original, template())

    def test_stripped_types_are_gone_and_listed(self):
        for name in ["LedgerPolicy", "Key", "Mapping", "Notifications"]:
            self.assertNotIn(name, self.resources)
        self.assertEqual(self.report["stripped"], {
            "AWS::S3::BucketPolicy": ["LedgerPolicy"], "AWS::KMS::Key": ["Key"],
            "AWS::Lambda::EventSourceMapping": ["Mapping"], "Custom::S3BucketNotifications": ["Notifications"]})
        kept = {t for t in self.report["kept"]}
        self.assertEqual(kept, {r["Type"] for r in template()["Resources"].values()} - set(self.report["stripped"]))
        self.assertTrue(all(r["Type"] in es.KEPT for r in self.resources.values()))

    def test_a_type_on_neither_list_stops_it(self):
        t = template()
        t["Resources"]["New"] = {"Type": "AWS::Glue::Job", "Properties": {}}
        with self.assertRaisesRegex(es.DeriveError, "AWS::Glue::Job"):
            es.derive(t)

    def test_the_lists_are_disjoint_and_give_reasons(self):
        self.assertFalse(set(es.KEPT) & set(es.STRIPPED))
        self.assertTrue(all(reason.strip() for reason in list(es.KEPT.values()) + list(es.STRIPPED.values())))

    def test_references_to_stripped_resources_are_replaced_and_listed(self):
        env = self.resources["Fn"]["Properties"]["Environment"]["Variables"]
        self.assertEqual(env["KEY"], "stripped:Key")
        self.assertEqual(env["Q"], {"Ref": "JobsQueue"})
        self.assertEqual(self.report["references"], [{"in": "Fn/Properties/Environment/Variables/KEY", "to": "Key"}])
        self.assertEqual(self.resources["Fn"]["DependsOn"], ["Role"])

    def test_a_sub_naming_a_stripped_resource_stops_it(self):
        t = template()
        t["Resources"]["Fn"]["Properties"]["Environment"]["Variables"]["S"] = {"Fn::Sub": "arn:${Key.Arn}"}
        with self.assertRaisesRegex(es.DeriveError, "Fn::Sub names a stripped resource"):
            es.derive(t)

    def test_outputs_of_stripped_resources_are_dropped_and_upload_events_added(self):
        self.assertEqual(self.report["outputs_dropped"], ["FleetKeyArn"])
        self.assertEqual(set(self.derived["Outputs"]), {"JobsBucketName", "JobQueueUrl", es.UPLOAD_EVENTS_OUTPUT})
        self.assertEqual(self.derived["Outputs"][es.UPLOAD_EVENTS_OUTPUT]["Value"], {"Ref": es.UPLOAD_EVENTS})
        self.assertEqual(self.resources[es.UPLOAD_EVENTS]["Type"], "AWS::SQS::Queue")

    def test_unnamed_fifo_queues_get_a_fifo_name(self):
        self.assertEqual(self.resources["LedgerFifo"]["Properties"]["QueueName"],
                         {"Fn::Join": ["", [{"Ref": "AWS::StackName"}, "-LedgerFifo.fifo"]]})
        self.assertEqual(self.resources["NamedFifo"]["Properties"]["QueueName"], "given.fifo")
        self.assertNotIn("QueueName", self.resources["JobsQueue"]["Properties"])

    def test_definition_substitutions_are_written_in(self):
        props = self.resources["Machine"]["Properties"]
        self.assertNotIn("DefinitionSubstitutions", props)
        self.assertEqual(props["DefinitionString"], {"Fn::Join": ["", [
            '{"F": "', {"Fn::GetAtt": ["Fn", "Arn"]}, '", "B": "', {"Ref": "Jobs"}, '", "C": "${...} stays", "G": "',
            {"Fn::GetAtt": ["Fn", "Arn"]}, '"}']]})

    def test_notifications_and_bucket_settings_are_left_for_deploy(self):
        self.assertEqual([n["logical_id"] for n in self.report["notifications"]], ["Notifications"])
        self.assertEqual(self.report["notifications"][0]["properties"], template()["Resources"]["Notifications"]["Properties"])
        self.assertEqual(set(self.report["bucket_settings"]), {"Ledger"})
        self.assertEqual(set(self.report["bucket_settings"]["Ledger"]), set(es.BUCKET_SETTINGS))

    def test_a_template_without_notifications_stops_it(self):
        t = template()
        del t["Resources"]["Notifications"]
        with self.assertRaisesRegex(es.DeriveError, "nothing would turn an upload into a job"):
            es.derive(t)

    def test_the_upload_events_name_must_be_free(self):
        t = template()
        t["Resources"][es.UPLOAD_EVENTS] = {"Type": "AWS::SQS::Queue", "Properties": {}}
        with self.assertRaises(es.DeriveError):
            es.derive(t)


class Notifications(unittest.TestCase):
    def test_lambda_destinations_become_the_upload_events_queue(self):
        calls = []

        class S3:
            def put_bucket_notification_configuration(self, **kwargs):
                calls.append(kwargs)

        _, report = es.derive(template())
        applied = es.apply_notifications(lambda service: S3(), report["notifications"], {"Jobs": "stack-jobs-x1"}, "arn:events")
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["Bucket"], "stack-jobs-x1")
        config = calls[0]["NotificationConfiguration"]
        self.assertEqual(list(config), ["QueueConfigurations"])
        (queue,) = config["QueueConfigurations"]
        self.assertEqual(queue["QueueArn"], "arn:events")
        self.assertEqual(queue["Events"], ["s3:ObjectCreated:*"])
        self.assertEqual(queue["Filter"], template()["Resources"]["Notifications"]["Properties"]["NotificationConfiguration"]
                         ["LambdaFunctionConfigurations"][0]["Filter"])
        self.assertEqual(applied[0]["bucket"], "stack-jobs-x1")


class Synthesized(unittest.TestCase):
    """The app's own template, when `scripts/emulator-stack.sh synth` made one."""

    PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".ephem", "emulator-stack", "cdk.out",
                        "EphemBatch.template.json")

    def test_the_synthesized_template_derives(self):
        if not os.path.exists(self.PATH):
            self.skipTest("no synthesized template (scripts/emulator-stack.sh synth)")
        with open(self.PATH) as f:
            original = json.load(f)
        derived, report = es.derive(copy.deepcopy(original))
        total = len(original["Resources"])
        self.assertEqual(sum(map(len, report["kept"].values())) + sum(map(len, report["stripped"].values())), total)
        self.assertEqual(len(derived["Resources"]), sum(map(len, report["kept"].values())) + 1)
        # What the flow needs is kept: buckets, queues, the state machine; no KMS key survives.
        for rtype in ["AWS::S3::Bucket", "AWS::SQS::Queue", "AWS::StepFunctions::StateMachine"]:
            self.assertIn(rtype, report["kept"])
        self.assertNotIn("AWS::KMS::Key", {r["Type"] for r in derived["Resources"].values()})


if __name__ == "__main__":
    unittest.main()
