package dev.gradbridge.online;

import java.util.List;
import java.util.Map;

/**
 * Decides whether a micro-batch's update may be applied, from its loss and gradients (computed,
 * not yet stepped). Never applied: a loss or a gradient that is not finite (NaN or infinite: one
 * such step makes every parameter NaN for good). Optionally refused: a gradient L2 norm above
 * {@code maxGradNorm}. The norm is summed in double precision, element by element in protocol
 * order, so Python's replay ({@code gradbridge.replay}) takes the same decision bit for bit.
 *
 * <p>The norm guard's trade-off: a limit protects the model from one outlier batch (a mislabelled
 * burst, an attack) at the price of dropping genuine large-gradient batches (early training, a
 * real shift in the data); unlike gradient clipping it never changes an applied update, so the
 * model stays exactly the training the log describes. Off by default.
 */
final class UpdateGuard {

    private final double maxGradNorm;

    /** @param maxGradNorm the norm limit; 0 for none */
    UpdateGuard(double maxGradNorm) {
        this.maxGradNorm = maxGradNorm;
    }

    /** @return whether every update's gradients must be read (a norm limit) */
    boolean readsGradients() {
        return maxGradNorm > 0;
    }

    /**
     * @return whether {@link #refuse} needs the gradients' values: with a norm limit, or when
     *     {@code gradientsFinite} is false (to name the gradient); else a finite loss and finite
     *     gradients are all it checks
     */
    boolean needsValues(double loss, boolean gradientsFinite) {
        return maxGradNorm > 0 || !gradientsFinite || !Double.isFinite(loss);
    }

    /**
     * @param loss the micro-batch's loss
     * @param names the parameters in protocol order
     * @param gradients their gradients (float32 widened exactly)
     * @return null to apply the update, else the reason it is not applied
     */
    String refuse(double loss, List<String> names, Map<String, double[]> gradients) {
        if (!Double.isFinite(loss)) {
            return "loss is " + loss;
        }
        double squares = 0;
        for (String name : names) {
            double[] gradient = gradients.get(name);
            if (gradient == null) {
                continue;
            }
            for (double value : gradient) {
                if (!Double.isFinite(value)) {
                    return "gradient of " + name + " is not finite";
                }
                squares += value * value;
            }
        }
        double norm = Math.sqrt(squares);
        if (maxGradNorm > 0 && !(norm <= maxGradNorm)) {
            return "gradient norm " + norm + " exceeds --max-grad-norm " + maxGradNorm;
        }
        return null;
    }
}
