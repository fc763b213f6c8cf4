package outboxd.bench.camel;

import java.io.FileReader;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;

import org.apache.camel.Exchange;
import org.apache.camel.Message;
import org.apache.camel.builder.RouteBuilder;
import org.apache.camel.component.kafka.KafkaConstants;
import org.apache.camel.component.kafka.consumer.KafkaManualCommit;
import org.apache.camel.spi.IdempotentRepository;
import org.apache.camel.support.processor.idempotent.MemoryIdempotentRepository;
import org.apache.camel.processor.idempotent.kafka.KafkaIdempotentRepository;

/**
 * The Apache Camel contender of outboxd's benchmark suite: Camel's Idempotent Consumer
 * in front of an HTTP call, as a Camel user would write it for Debezium outbox events.
 *
 * <p>The route consumes the topics with camel-kafka ({@code consumersCount} consumers,
 * one thread each, one exchange at a time per consumer: the manual commit must run on
 * the consumer's thread, so no asynchronous EIP), keys the idempotent consumer on the
 * event id (the {@code id} header Debezium's outbox EventRouter sets), POSTs the value
 * to the receiver as outboxd's http handler does ({@code /e/{aggregate id}}, the
 * {@code Idempotency-Key}, {@code Outbox-Event-Type} and {@code Outbox-Aggregate-Id}
 * headers, {@code application/json}) and then commits the record's offset.
 *
 * <p>The settings come from a properties file (the only argument), written by the
 * driver: {@code brokers}, {@code group}, {@code topics} (comma-separated),
 * {@code receiver} (base URL), {@code partitions} (how many the group must hold before
 * the start line is printed), {@code consumers}, optionally {@code session.timeout.ms} (the crash scenario's), and
 * {@code mode}:
 *
 * <ul>
 *   <li>{@code camel}: Camel's at-least-once recipe: {@link KafkaIdempotentRepository}
 *       on its own topic ({@code repository.topic}) with {@code maxCacheSize} =
 *       {@code repository.cache}, {@code eager=false}, {@code completionEager=true},
 *       {@code allowManualCommit=true}, {@code autoCommitEnable=false},
 *       {@code breakOnFirstError=true}, {@link KafkaManualCommit#commit()} after the call.
 *   <li>{@code camel-defaults}: the same route with Camel's defaults for the idempotent
 *       consumer (eager), the repository (1000 ids cached) and the consumer (auto commit
 *       every 5 s, the next record after a failure).
 *   <li>{@code camel-memory}: as {@code camel}, with a {@link MemoryIdempotentRepository}
 *       of {@code repository.cache} ids instead (nothing survives a restart).
 * </ul>
 *
 * <p>Only {@code autoOffsetReset=earliest} departs from the consumer's defaults in
 * every mode: the group is new and must read the backlog. Prints
 * {@code partitions assigned: N} on stderr once the route's consumers hold every
 * partition (see {@link AssignmentLog}); stops on SIGTERM and exits 0.
 */
public final class Main {
    private static final String COMMIT = "outboxd.bench.commit";

    private Main() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: outboxd-camel SETTINGS.properties");
            System.exit(2);
        }
        Properties p = new Properties();
        try (Reader r = new FileReader(args[0], StandardCharsets.UTF_8)) {
            p.load(r);
        }
        String mode = p.getProperty("mode");
        boolean recipe = !mode.equals("camel-defaults");
        int cache = Integer.parseInt(p.getProperty("repository.cache", "1000"));
        IdempotentRepository repository = switch (mode) {
            case "camel" -> new KafkaIdempotentRepository(
                    p.getProperty("repository.topic"), p.getProperty("brokers"), cache, 100);
            case "camel-defaults" -> new KafkaIdempotentRepository(
                    p.getProperty("repository.topic"), p.getProperty("brokers"));
            case "camel-memory" -> MemoryIdempotentRepository.memoryIdempotentRepository(cache);
            default -> throw new IllegalArgumentException("unknown mode " + mode);
        };

        StringBuilder from = new StringBuilder("kafka:").append(p.getProperty("topics"))
                .append("?brokers=").append(p.getProperty("brokers"))
                .append("&groupId=").append(p.getProperty("group"))
                .append("&consumersCount=").append(p.getProperty("consumers"))
                .append("&autoOffsetReset=earliest");
        if (recipe) {
            from.append("&allowManualCommit=true&autoCommitEnable=false&breakOnFirstError=true");
        }
        String session = p.getProperty("session.timeout.ms");
        if (session != null) {
            from.append("&sessionTimeoutMs=").append(session).append("&heartbeatIntervalMs=1000");
        }
        String receiver = p.getProperty("receiver");

        org.apache.camel.main.Main main = new org.apache.camel.main.Main();
        main.bind(KafkaConstants.KAFKA_SUBSCRIBE_ADAPTER,
                new AssignmentLog(Integer.parseInt(p.getProperty("partitions"))));
        main.configure().withShutdownTimeout(5);
        main.configure().addRoutesBuilder(new RouteBuilder() {
            @Override
            public void configure() {
                var idempotent = from(from.toString()).routeId("outbox")
                        .process(Main::toRequest)
                        .idempotentConsumer(header("Idempotency-Key"), repository);
                if (recipe) {
                    idempotent.eager(false).completionEager(true);
                }
                idempotent
                        .to(receiver)
                        .end()
                        .process(Main::commit);
            }
        });
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), s -> main.completed());
        main.run();
        System.exit(0);
    }

    /**
     * The Kafka record as the receiver's request: the value as body, the event id, type
     * and aggregate id as headers; the record's manual commit (when on) kept aside as an
     * exchange property, since the HTTP call replaces the message headers.
     */
    private static void toRequest(Exchange e) {
        Message m = e.getMessage();
        String id = text(m.getHeader("id"));
        String type = text(m.getHeader("eventType"));
        String key = m.getHeader(KafkaConstants.KEY, String.class);
        Object commit = m.getHeader(KafkaConstants.MANUAL_COMMIT);
        if (commit != null) {
            e.setProperty(COMMIT, commit);
        }
        m.removeHeaders("*");
        m.setHeader(Exchange.HTTP_METHOD, "POST");
        m.setHeader(Exchange.HTTP_PATH, "/e/" + key);
        m.setHeader(Exchange.CONTENT_TYPE, "application/json");
        m.setHeader("Idempotency-Key", id);
        if (type != null) {
            m.setHeader("Outbox-Event-Type", type);
        }
        if (key != null) {
            m.setHeader("Outbox-Aggregate-Id", key);
        }
    }

    /** Commits the record's offset (synchronously) once its call returned or it was a duplicate. */
    private static void commit(Exchange e) {
        KafkaManualCommit commit = e.getProperty(COMMIT, KafkaManualCommit.class);
        if (commit != null) {
            commit.commit();
        }
    }

    /** A Kafka header's value (camel-kafka hands them over as bytes) as text. */
    private static String text(Object v) {
        if (v instanceof byte[] b) {
            return new String(b, StandardCharsets.UTF_8);
        }
        return v == null ? null : v.toString();
    }
}
