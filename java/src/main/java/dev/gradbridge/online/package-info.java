/**
 * Online learning beside serving: {@link dev.gradbridge.online.OnlineLearner} takes feedback rows
 * ({@link dev.gradbridge.online.HostTensor}), writes them to a write-ahead log before it accepts
 * them, trains on micro-batches on one thread, publishes versions ({@link
 * dev.gradbridge.online.ModelVersion}) to predictors ({@link dev.gradbridge.online.Prediction}),
 * and recovers from its log after a crash. Its other public types are what its methods take or
 * return; the rest of the package is package-private.
 */
package dev.gradbridge.online;
