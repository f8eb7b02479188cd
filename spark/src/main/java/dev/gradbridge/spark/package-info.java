/**
 * gradbridge-spark: {@link dev.gradbridge.spark.SparkTrainer} trains one module data-parallel over
 * a Spark barrier stage (one replica per partition, gradients combined each step), and {@link
 * dev.gradbridge.spark.SparkTrainCommand} is {@code gradbridge-spark-train}. The Spark internals it
 * relies on are named, with why, in one class: {@link dev.gradbridge.spark.SparkInternals}.
 */
package dev.gradbridge.spark;
