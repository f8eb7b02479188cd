/** Example drivers; {@link dev.gradbridge.examples.LinearRegressionTraining} is the seed's. */
package dev.gradbridge.examples;
