/**
 * gradbridge: train exported PyTorch training modules from Java on DJL's PyTorch engine.
 *
 * <p>{@link dev.gradbridge.TrainingModule} loads a module written by {@code gradbridge export}
 * and runs its protocol methods ({@link dev.gradbridge.Protocol}) with autograd; {@link
 * dev.gradbridge.History} records a run in the JSON Lines schema that the Python side reads.
 */
package dev.gradbridge;
