package dev.gradbridge.serve;

import dev.gradbridge.internal.Messages;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.eclipse.jetty.http.HttpException;
import org.eclipse.jetty.http.HttpHeader;
import org.eclipse.jetty.http.HttpStatus;
import org.eclipse.jetty.server.Request;
import org.eclipse.jetty.server.Response;
import org.eclipse.jetty.server.handler.ErrorHandler;
import org.eclipse.jetty.util.Callback;

/**
 * Jetty's error pages (a request it refuses before the routes see it: a malformed request line or
 * chunk, headers over the limit, a body over the limit, a request during the graceful stop) as the
 * service's own answer: one {@code error:} line, like every route's refusal, instead of HTML.
 */
final class ErrorLines extends ErrorHandler {

    private final long maxBodyBytes;

    ErrorLines(long maxBodyBytes) {
        this.maxBodyBytes = maxBodyBytes;
    }

    @Override
    public boolean handle(Request request, Response response, Callback callback) {
        int code = response.getStatus();
        String message = (String) request.getAttribute(ERROR_MESSAGE);
        Throwable cause = (Throwable) request.getAttribute(ERROR_EXCEPTION);
        if (cause instanceof HttpException) {
            code = ((HttpException) cause).getCode();
            response.setStatus(code);
            if (message == null) {
                message = ((HttpException) cause).getReason();
            }
        }
        response.getHeaders().put(ERROR_CACHE_CONTROL);
        if (HttpStatus.hasNoBody(code) || "HEAD".equals(request.getMethod())) {
            callback.succeeded();
            return true;
        }
        response.getHeaders().put(HttpHeader.CONTENT_TYPE, "text/plain; charset=utf-8");
        long declared = request.getHeaders().getLongField(HttpHeader.CONTENT_LENGTH);
        byte[] line = (Messages.ERROR_PREFIX + describe(code, message, declared) + "\n").getBytes(StandardCharsets.UTF_8);
        response.write(true, ByteBuffer.wrap(line), callback);
        return true;
    }

    /** The one line for a status Jetty answers by itself. */
    String describe(int code, String message, long declaredLength) {
        String reason = message == null ? "" : message.replaceAll("[\\r\\n]+", " ").trim();
        if (reason.length() > 200) {
            reason = reason.substring(0, 200) + "...";
        }
        switch (code) {
            case HttpStatus.BAD_REQUEST_400:
                return "malformed HTTP request" + (reason.isEmpty() || reason.equals(HttpStatus.getMessage(code)) ? "" : ": " + reason);
            case HttpStatus.PAYLOAD_TOO_LARGE_413:
                return "body " + (declaredLength > maxBodyBytes ? "of " + declaredLength + " bytes " : "")
                        + "exceeds the limit of " + maxBodyBytes + " bytes (--max-body-bytes)";
            case HttpStatus.URI_TOO_LONG_414:
                return "request URI too long";
            case HttpStatus.REQUEST_HEADER_FIELDS_TOO_LARGE_431:
                return "request headers too large (a bearer token is at most " + Tokens.MAX_LENGTH + " characters)";
            case HttpStatus.SERVICE_UNAVAILABLE_503:
                return "the service is stopping or cannot take the request now; retry later";
            default:
                String status = code + " " + HttpStatus.getMessage(code);
                return reason.isEmpty() || reason.equals(HttpStatus.getMessage(code)) ? status : status + ": " + reason;
        }
    }
}
