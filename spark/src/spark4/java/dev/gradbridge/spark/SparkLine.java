package dev.gradbridge.spark;

import java.util.Iterator;
import scala.jdk.javaapi.CollectionConverters;

/**
 * What differs between the Spark lines gradbridge-spark is built for, for the Spark 4.0 to 4.3 line
 * (Scala 2.13): the artifact {@code gradbridge-spark_2.13}. Its twin for Spark 3.5.x (Scala 2.12) is
 * {@code src/spark3.5/java/.../SparkLine.java}; each artifact compiles exactly one of them with the
 * shared sources, so both must offer the same members.
 */
final class SparkLine {

    /** The Spark versions this artifact is built for, for messages. */
    static final String SPARK = "4.0 to 4.3";
    /** The Scala binary version of this artifact (and of the Spark it runs on). */
    static final String SCALA = "2.13";

    private SparkLine() {}

    /** @return whether this artifact runs on Spark {@code sparkVersion} (of Scala {@link #SCALA}) */
    static boolean runsOn(String sparkVersion) {
        return sparkVersion.startsWith("4.");
    }

    /** @return {@code iterator} as a Scala iterator (Scala 2.13's converters) */
    static <T> scala.collection.Iterator<T> asScala(Iterator<T> iterator) {
        return CollectionConverters.asScala(iterator);
    }

    /** @return {@code iterator} as a Java iterator (Scala 2.13's converters) */
    static <T> Iterator<T> asJava(scala.collection.Iterator<T> iterator) {
        return CollectionConverters.asJava(iterator);
    }
}
