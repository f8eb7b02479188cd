import org.gradle.api.Project
import org.gradle.api.tasks.JavaExec
import org.gradle.api.tasks.bundling.Jar
import org.gradle.api.tasks.application.CreateStartScripts
import org.gradle.util.GradleVersion

/** What every gradbridge build file needs, once: the Gradle-version gate and program arguments. */
class GradbridgeBuild {

    /**
     * Gradle 6.4 and later: `mainClass`, `archiveBaseName`, `archiveClassifier`. Gradle 4.4.1 has only the
     * older names (`main`, `mainClassName`, `baseName`, `classifier`), which current Gradle removed.
     */
    static final boolean modernGradle = GradleVersion.current() >= GradleVersion.version('6.4')

    /**
     * The words of `-Pargs="..."` (works on every Gradle; --args exists only since 4.9). Quoted words stay
     * together: -Pargs="--history 'my file.jsonl'".
     */
    static List<String> splitArgs(String line) {
        def words = []
        def matcher = line =~ /"([^"]*)"|'([^']*)'|(\S+)/
        matcher.each { m -> words << (m[1] != null ? m[1] : (m[2] != null ? m[2] : m[3])) }
        return words
    }

    /** The program arguments given as -Pargs="..." (none without it). */
    static List<String> programArgs(Project project) {
        project.hasProperty('args') ? splitArgs(project.property('args').toString()) : []
    }

    /** A jar task's base name: `archiveBaseName` on Gradle 6.4+, `baseName` before (removed in Gradle 8). */
    static void baseName(Jar task, String name) {
        if (modernGradle) {
            task.archiveBaseName.set(name)
        } else {
            task.baseName = name
        }
    }

    /**
     * A JavaExec task runs {@code mainClass} with the -Pargs="..." words: `mainClass` on Gradle 6.4+, `main`
     * before (removed in Gradle 8).
     */
    static void runs(JavaExec task, String mainClass, Project project) {
        if (modernGradle) {
            task.mainClass.set(mainClass)
        } else {
            task.main = mainClass
        }
        task.args programArgs(project)
    }

    /**
     * Debian's Gradle 4.4.1 start-script template probes `java -version` and lets the banner reach stderr on
     * every start; silence the probe so that an error stays one line. (No-op elsewhere.)
     */
    static void quietJavaProbe(CreateStartScripts task) {
        task.doLast {
            def script = new File(task.outputDir, task.applicationName)
            script.text = script.text.replace(' -version ; then', ' -version >/dev/null 2>&1 ; then')
        }
    }
}
