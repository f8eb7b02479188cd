/**
 * Training data ({@link dev.gradbridge.data.Dataset}: npz/npy files or native buffers, checked
 * against a module's metadata) and the cross-language mini-batch order ({@link
 * dev.gradbridge.data.Shuffle}).
 */
package dev.gradbridge.data;
