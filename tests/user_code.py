"""A user's own Java class for the tests that put one on the JVM's classpath beside gradbridge's library
(tests/test_user_classpath.py, test_user_projects.py): its source, the Python line that calls it and the start
of what that prints (the number of protocol methods follows)."""

import textwrap

USER_CLASS = textwrap.dedent("""\
    package my.project;

    public final class Thing {
        private Thing() {}

        /** A user method that reaches gradbridge's own classes in the same JVM. */
        public static String describe(String who) {
            return "hello " + who + ", protocol methods: " + dev.gradbridge.Protocol.REQUIRED_METHODS.size();
        }
    }
    """)
CALL = ("import jpype; print(jpype.JClass('my.project.Thing').describe('python'))")
EXPECTED = "hello python, protocol methods: "
