package outboxd.bench.camel;

import java.util.Collection;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.camel.component.kafka.consumer.support.subcription.DefaultSubscribeAdapter;
import org.apache.camel.component.kafka.consumer.support.subcription.SubscribeAdapter;
import org.apache.camel.component.kafka.consumer.support.subcription.TopicInfo;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.common.TopicPartition;

/**
 * camel-kafka's subscribe hook (bound as {@code subscribeAdapter}): subscribes as Camel
 * does, with Camel's rebalance listener wrapped to count the partitions the route's
 * consumers hold. The first time they hold all {@code expected}, it prints
 * {@code partitions assigned: N} on stderr: the benchmark driver starts its clock on that
 * line, as it does on outboxd's.
 */
final class AssignmentLog implements SubscribeAdapter {
    private final SubscribeAdapter inner = new DefaultSubscribeAdapter();
    private final int expected;
    private final AtomicInteger held = new AtomicInteger();
    private final AtomicBoolean printed = new AtomicBoolean();

    AssignmentLog(int expected) {
        this.expected = expected;
    }

    @Override
    public void subscribe(Consumer<?, ?> consumer, ConsumerRebalanceListener camel, TopicInfo topics) {
        inner.subscribe(consumer, new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                held.addAndGet(-partitions.size());
                camel.onPartitionsRevoked(partitions);
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> partitions) {
                held.addAndGet(-partitions.size());
                camel.onPartitionsLost(partitions);
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                camel.onPartitionsAssigned(partitions);
                int n = held.addAndGet(partitions.size());
                if (n >= expected && printed.compareAndSet(false, true)) {
                    System.err.println("partitions assigned: " + n);
                }
            }
        }, topics);
    }
}
