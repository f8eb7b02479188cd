package dev.gradbridge;

import com.google.gson.JsonObject;
import com.google.gson.JsonElement;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Enumeration;
import java.util.Map;
import java.util.zip.ZipEntry;
import java.util.zip.ZipException;
import java.util.zip.ZipFile;

/**
 * A module's {@code gradbridge.json} read straight from its .pt archive (a zip), before libtorch loads
 * anything: found, bounded in size, parsed, checked against the schema. Apart from {@link Metadata}, which
 * is the document's API.
 */
final class MetadataArchive {

    private MetadataArchive() {}

    /** @see Metadata#read */
    static Metadata read(Path path) {
        try (ZipFile archive = new ZipFile(path.toFile())) {
            ZipEntry entry = findMetadataEntry(archive);
            if (entry == null) {
                String kind =
                        findEntry(archive, "/data.pkl") != null
                                ? "a TorchScript module without " + Protocol.METADATA_FILE
                                : "a zip archive but not a TorchScript module";
                throw new ProtocolException(
                        path
                                + " is "
                                + kind
                                + ": not a gradbridge training module. Export one with"
                                + " `gradbridge export`.");
            }
            Metadata metadata;
            byte[] bytes;
            try (InputStream in = archive.getInputStream(entry)) { // bounded: an entry may inflate past any memory
                bytes = in.readNBytes((int) StrictJson.JSON_BYTES + 1);
            }
            if (bytes.length > StrictJson.JSON_BYTES) {
                throw new ProtocolException(path + ": " + Protocol.METADATA_FILE + " inflates past the limit of "
                        + StrictJson.JSON_BYTES + " bytes");
            }
            try (Reader reader = new InputStreamReader(new ByteArrayInputStream(bytes), StandardCharsets.UTF_8)) {
                JsonElement root = JsonParser.parseReader(reader);
                MetadataSchema.check(path, root);
                metadata = of(root.getAsJsonObject());
            } catch (JsonParseException | IllegalStateException e) {
                throw new ProtocolException(path + ": " + Protocol.METADATA_FILE + " is not valid JSON: "
                        + e.getMessage().split("\n", 2)[0]); // Gson adds a line pointing at its documentation
            }
            check(path, metadata);
            return metadata;
        } catch (ZipException e) {
            throw new ModuleLoadException(
                    path + " is not a TorchScript file (not a zip archive): " + e.getMessage(), e);
        } catch (IOException e) {
            throw new ModuleLoadException("cannot read " + path + ": " + e, e);
        }
    }

    private static ZipEntry findMetadataEntry(ZipFile archive) {
        ZipEntry root = archive.getEntry(Protocol.METADATA_FILE); // a protocol-3 zip holds it at its root
        return root != null ? root : findEntry(archive, "/extra/" + Protocol.METADATA_FILE);
    }

    private static ZipEntry findEntry(ZipFile archive, String suffix) {
        Enumeration<? extends ZipEntry> entries = archive.entries();
        while (entries.hasMoreElements()) {
            ZipEntry entry = entries.nextElement();
            if (entry.getName().endsWith(suffix)) {
                return entry;
            }
        }
        return null;
    }

    /** The metadata of a document {@link #read} read and checked against the schema; Gson's errors pass. */
    private static Metadata of(JsonObject document) {
        Metadata metadata = Metadata.GSON.fromJson(document, Metadata.class);
        metadata.document = document;
        if (metadata.checkpoint != null) {
            java.util.Set<String> keys = new java.util.HashSet<>();
            for (Map.Entry<String, JsonElement> key : document.getAsJsonObject("checkpoint").entrySet()) {
                if (!key.getValue().isJsonNull()) {
                    keys.add(key.getKey());
                }
            }
            metadata.checkpoint.keys = keys;
        }
        return metadata;
    }

    /** The checks of the fields every protocol version has, after the schema's. */
    private static void check(Path path, Metadata metadata) {
        if (!Protocol.METADATA_FORMAT.equals(metadata.format)) {
            throw new ProtocolException(
                    path
                            + ": "
                            + Protocol.METADATA_FILE
                            + " has format '"
                            + metadata.format
                            + "', expected '"
                            + Protocol.METADATA_FORMAT
                            + "'");
        }
        if (!Protocol.SUPPORTED_VERSIONS.contains(metadata.protocolVersion)) {
            throw new ProtocolException(
                    path
                            + ": protocol version "
                            + metadata.protocolVersion
                            + ", this gradbridge reads versions "
                            + Protocol.SUPPORTED_VERSIONS
                            + ". Re-export the module with a matching gradbridge.");
        }
        if (metadata.parameters == null || metadata.inputs == null || metadata.methods == null) {
            throw new ProtocolException(
                    path + ": " + Protocol.METADATA_FILE + " lacks parameters, inputs or methods");
        }
    }
}
