// The package's entry point (package.json "main"/"types"): the EphemBatch construct for CDK users,
// its props and settings, and the app's own stack for those who deploy it as it is.
export { EphemBatch, EphemBatchProps, resolveProps } from './ephem-batch';
export { EphemBatchStack, EphemBatchStackProps } from './ephem-batch-stack';
export { ConfigError, DeployConfig, HostImage, LedgerLockMode, Measurements, loadConfig, loadMeasurements, measurementsFromPolicyFile } from './config';
export { buildApp, FEATURE_FLAGS } from './app';
