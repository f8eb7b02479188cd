package dev.gradbridge.online;

import java.util.Locale;

/** What a publish gate does to the learner when it holds a version back (see {@link OnlineLearnerBuilder#optGate}). */
public enum HoldPolicy {
    /**
     * Training goes on from the held-back version (predictions stay on the serving one); a later
     * version is published once it passes the gate. Cheap; a learner that drifted may stay held.
     */
    CONTINUE,
    /**
     * The learner returns to the serving version (its parameters and optimizer state) and goes on
     * from there: the feedback since is applied but its effect dropped. Costs a copy of the learner
     * per published version, kept with it.
     */
    ROLLBACK;

    /** @return the policy's name as options and the log spell it ({@code continue}, {@code rollback}) */
    public String label() {
        return name().toLowerCase(Locale.ROOT);
    }

    /**
     * Parses {@code continue} or {@code rollback} (any case).
     *
     * @param text the policy name
     * @return the policy
     * @throws IllegalArgumentException for any other text
     */
    public static HoldPolicy parse(String text) {
        for (HoldPolicy policy : values()) {
            if (policy.name().equalsIgnoreCase(text)) {
                return policy;
            }
        }
        throw new IllegalArgumentException("unknown --gate-on-hold policy '" + text + "'; expected continue or rollback");
    }
}
