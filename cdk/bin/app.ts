#!/usr/bin/env node
// `cdk synth|deploy` entry point (cdk.json: "node dist/bin/app.js").
import { ConfigError } from '../lib/config';
import { buildApp } from '../lib/app';

try {
  buildApp().app.synth();
} catch (e) {
  if (e instanceof ConfigError) {
    process.stderr.write(`ephem-batch: ${e.message}\n`);
    process.exit(1);
  }
  throw e;
}
