/**
 * gradbridge: train exported PyTorch training modules from Java through gradbridge's own JNI layer
 * over libtorch, bit for bit equal to eager PyTorch.
 *
 * <p>{@link dev.gradbridge.Trainer} runs the main job (epochs over a {@link
 * dev.gradbridge.data.Dataset}, checkpoints, a {@link dev.gradbridge.History}); {@link
 * dev.gradbridge.TrainingModule} loads a module written by {@code gradbridge export} and runs its
 * protocol methods ({@link dev.gradbridge.Protocol}) with autograd, one call at a time. The public
 * types of this package, {@code dev.gradbridge.data} and {@code dev.gradbridge.online} are the
 * library's API (listed in docs/java-api.md); {@code dev.gradbridge.internal} is not.
 */
package dev.gradbridge;
