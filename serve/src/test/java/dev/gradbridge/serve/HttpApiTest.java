package dev.gradbridge.serve;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.gradbridge.online.FsyncPolicy;
import dev.gradbridge.online.OnlineLearner;
import io.javalin.Javalin;
import java.io.IOException;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** The HTTP layer over a real learner (the build's linear-regression test module), on a free port. */
public class HttpApiTest {

    private static final String TOKEN = "s3cret-token-for-the-test";
    private static final long MAX_BODY = 4096;

    @ClassRule public static final TemporaryFolder FOLDER = new TemporaryFolder();

    private static OnlineLearner learner;
    private static Javalin server;

    @BeforeClass
    public static void start() throws IOException {
        String models = System.getProperty("gradbridge.testModels");
        if (models == null) {
            throw new IllegalStateException("run through Gradle: -Dgradbridge.testModels is not set");
        }
        learner = OnlineLearner.builder().optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(Paths.get(models, "linear_regression.pt"), FOLDER.newFolder("log").toPath());
        server = new HttpApi(learner, TOKEN, MAX_BODY)
                .server("127.0.0.1", 0, 8, 10_000, 5_000, true, null, 100, 1024).start();
    }

    @AfterClass
    public static void stop() throws IOException {
        if (server != null) {
            server.stop();
        }
        if (learner != null) {
            learner.close();
        }
    }

    /** An answer: status and body. */
    private static final class Answer {
        final int status;
        final String body;

        Answer(String raw) {
            int end = raw.indexOf("\r\n\r\n");
            status = Integer.parseInt(raw.substring(9, 12));
            body = raw.substring(end + 4);
        }

        JsonObject json() {
            return JsonParser.parseString(body).getAsJsonObject();
        }
    }

    /** One request on a connection of its own, closed after the answer (no connection outlives a test). */
    private static Answer send(String method, String path, String body, boolean authorized) throws IOException {
        try (Socket socket = new Socket("127.0.0.1", server.port())) {
            byte[] bytes = body == null ? new byte[0] : body.getBytes(StandardCharsets.UTF_8);
            StringBuilder head = new StringBuilder(method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n");
            if (authorized) {
                head.append("Authorization: Bearer ").append(TOKEN).append("\r\n");
            }
            if (body != null) {
                head.append("Content-Type: application/json\r\nContent-Length: ").append(bytes.length).append("\r\n");
            }
            head.append("Connection: close\r\n\r\n");
            OutputStream out = socket.getOutputStream();
            out.write(head.toString().getBytes(StandardCharsets.US_ASCII));
            out.write(bytes);
            out.flush();
            return new Answer(new String(socket.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
        }
    }

    private static void assertRefused(int status, String line, Answer answer) {
        assertEquals(answer.body, status, answer.status);
        assertEquals("error: " + line + "\n", answer.body);
    }

    @Test
    public void aPredictionAnswersWithTheServingVersion() throws Exception {
        Answer answer = send("POST", "/predict", "{\"x\": [[0.5], [1.5]]}", true);
        assertEquals(answer.body, 200, answer.status);
        assertEquals(0, answer.json().get("version").getAsLong());
        assertEquals(2, answer.json().getAsJsonArray("y").size());
    }

    @Test
    public void feedbackIsAcceptedWithItsSequenceNumbers() throws Exception {
        Answer answer = send("POST", "/feedback", "{\"x\": [[1.0]], \"y\": [[2.0]]}", true);
        assertEquals(answer.body, 200, answer.status);
        assertEquals(1, answer.json().get("accepted").getAsLong());
        assertTrue(answer.json().get("first_seq").getAsLong() >= 0);
    }

    @Test
    public void aRequestWithoutTheTokenIs401AndChangesNothing() throws Exception {
        long accepted = learner.stats().getAcceptedEvents();
        assertRefused(401, "missing or wrong token: send 'Authorization: Bearer TOKEN' (the operator has TOKEN)",
                send("POST", "/feedback", "{\"x\": [[1.0]], \"y\": [[2.0]]}", false));
        assertEquals(accepted, learner.stats().getAcceptedEvents());
    }

    @Test
    public void badBodiesAreOneErrorLineWithA4xx() throws Exception {
        assertRefused(400, "body must be a JSON object, got [1]", send("POST", "/predict", "[1]", true));
        Answer truncated = send("POST", "/predict", "{\"x\": [[1.0]", true);
        assertEquals(400, truncated.status);
        assertTrue(truncated.body, truncated.body.startsWith("error: body is not valid JSON: "));
        assertRefused(400, "field 'x' is not rectangular: expected 1 items at depth 1, found [1.0,2.0]",
                send("POST", "/predict", "{\"x\": [[1.0], [1.0, 2.0]]}", true));
        String large = "{\"x\": [[" + "1.0, ".repeat(1000) + "1.0]]}";
        assertRefused(413, "body of " + large.length() + " bytes exceeds the limit of " + MAX_BODY
                + " bytes (--max-body-bytes)", send("POST", "/predict", large, true));
    }

    @Test
    public void unknownRoutesAreOneErrorLine() throws Exception {
        assertRefused(404, "no route GET /nowhere", send("GET", "/nowhere", null, true));
        assertRefused(404, "no route GET /predict", send("GET", "/predict", null, true));
    }

    @Test
    public void healthSaysTheLearnerIsUp() throws Exception {
        Answer answer = send("GET", "/healthz", null, false);
        assertEquals(200, answer.status);
        assertEquals("ok", answer.json().get("status").getAsString());
    }
}
