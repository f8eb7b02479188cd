package dev.gradbridge.internal;

import java.util.Arrays;

/**
 * The wording of the lines about a model's inputs: their specs, names, missing or unknown arrays
 * and columns, values the model cannot take (python: {@code gradbridge.messages}, the same
 * sentences; {@link Messages} has the others).
 */
public final class InputMessages {

    private InputMessages() {}

    // ---- a model's inputs (Inputs; Python: gradbridge.inputs) ----

    /** What the metadata's {@code inputs} must hold. */
    public static final String INPUT_SPECS =
            "the specs of the model's inputs (x, or several by name) then y, each name once";

    /**
     * @param source the data file
     * @param name the array it lacks
     * @param holds the arrays it holds
     * @param needs the arrays the module needs: its inputs, then y
     * @return the line for a data file without an array the module needs
     */
    public static String inputMissing(String source, String name, java.util.List<String> holds,
            java.util.List<String> needs) {
        StringBuilder save = new StringBuilder();
        for (String need : needs) {
            save.append(save.length() == 0 ? "" : ", ").append(need).append("=...");
        }
        return source + ": missing array '" + name + "'; the file holds [" + String.join(", ", holds)
                + "] (save with numpy.savez(path, " + save + "))";
    }

    /**
     * @param method the method called with one tensor
     * @param names the inputs the model takes
     * @return the line for a one-tensor call on a model of several inputs
     */
    public static String namedInputsNeeded(String method, java.util.List<String> names) {
        return method + ": the model takes the inputs " + names + ": pass them by name (a Map of name to Tensor)";
    }

    /**
     * @param method the method called
     * @param name the input it was given that the model does not take
     * @param names the inputs the model takes
     * @return the line for an unknown input name
     */
    public static String unknownInput(String method, String name, java.util.List<String> names) {
        return method + ": input " + name + ": the model takes no such input (it takes " + names + ")";
    }

    /**
     * @param method the method called
     * @param name the input it was not given
     * @param names the inputs the model takes
     * @return the line for a missing input
     */
    public static String missingInput(String method, String name, java.util.List<String> names) {
        return method + ": input " + name + " is missing (the model takes " + names + ")";
    }


    /**
     * @param source the Parquet data
     * @param column a column of it that is neither an input of the model nor y
     * @param inputs the model's inputs
     * @return the line for a column that a module of several inputs does not take
     */
    public static String unknownColumn(String source, String column, java.util.List<String> inputs) {
        return notAnInput(source, "column", column, inputs,
                "a model of several inputs trains on exactly its inputs' columns and y: drop the others");
    }

    /**
     * @param source the .npz file
     * @param array an array of it that is neither an input of the model nor y
     * @param inputs the model's inputs
     * @return the line for an array the module does not take (any module: an .npz holds what was
     *     saved for training, a Parquet table of a one-input model may carry other columns)
     */
    public static String unknownArray(String source, String array, java.util.List<String> inputs) {
        return notAnInput(source, "array", array, inputs,
                "an .npz holds exactly the model's inputs and y: drop the others");
    }

    private static String notAnInput(String source, String kind, String name, java.util.List<String> inputs,
            String rule) {
        return source + ": " + kind + " " + name + " is not an input of the model (it takes " + inputs + " and y); "
                + rule;
    }

    /**
     * @param source the data (a file, or {@code training data} for arrays)
     * @param array the input (or y) that holds the value
     * @param element where in a row, for rows of more than one value; null otherwise
     * @param value the value the model does not take
     * @param low the smallest value the model takes there, searched from 0
     * @param high the largest
     * @return the line for an id or label the model cannot take (a class past its classes, an id
     *     past its embedding's rows): libtorch's error names neither the data nor the array
     */
    public static String valueOutOfRange(String source, String array, long[] element, long value, long low,
            long high) {
        String at = element == null ? "" : " at element " + Arrays.toString(element) + " of a row";
        String there = element == null ? "" : " there";
        return source + ": " + array + " holds " + value + at + ", outside the range the model takes" + there + " ("
                + low + ".." + high + ")";
    }


    /**
     * @param name the input field
     * @param index the element's index, e.g. {@code [2, 1]}
     * @param value its value
     * @param limit the magnitude limit
     * @return the line refusing an input value beyond the limit
     */
    public static String inputTooLarge(String name, String index, double value, double limit) {
        return "field '" + name + "' element " + index + " is " + value + ", beyond the input magnitude limit " + limit
                + " (--max-input-abs; 0 turns it off)";
    }
}
