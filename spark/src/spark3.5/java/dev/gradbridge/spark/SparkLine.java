package dev.gradbridge.spark;

import java.util.Iterator;
import scala.collection.JavaConverters;

/**
 * What differs between the Spark lines gradbridge-spark is built for, for the Spark 3.5.x line
 * (Scala 2.12): the artifact {@code gradbridge-spark_2.12}. Its twin for Spark 4.0 to 4.3 (Scala 2.13)
 * is {@code src/spark4/java/.../SparkLine.java}; each artifact compiles exactly one of them with the
 * shared sources, so both must offer the same members.
 */
final class SparkLine {

    /** The Spark versions this artifact is built for, for messages. */
    static final String SPARK = "3.5.x";
    /** The Scala binary version of this artifact (and of the Spark it runs on). */
    static final String SCALA = "2.12";

    private SparkLine() {}

    /** @return whether this artifact runs on Spark {@code sparkVersion} (of Scala {@link #SCALA}) */
    static boolean runsOn(String sparkVersion) {
        return sparkVersion.startsWith("3.5.");
    }

    /** @return {@code iterator} as a Scala iterator (Scala 2.12 has no scala.jdk.javaapi) */
    static <T> scala.collection.Iterator<T> asScala(Iterator<T> iterator) {
        return JavaConverters.asScalaIterator(iterator);
    }

    /** @return {@code iterator} as a Java iterator (Scala 2.12 has no scala.jdk.javaapi) */
    static <T> Iterator<T> asJava(scala.collection.Iterator<T> iterator) {
        return JavaConverters.asJavaIterator(iterator);
    }
}
