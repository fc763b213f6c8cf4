-- Outbox schema for outboxd (loaded by `scripts/stack up postgres` into database `outbox`).
-- Safe to run more than once.
--
-- Debezium's PostgreSQL connector streams the rows of public.outbox from the WAL
-- (pgoutput plugin, publication dbz_publication), and its outbox EventRouter turns each
-- insert into one Kafka message (see debezium/connector.json):
--   topic   outbox.event.<aggregatetype>
--   key     aggregateid
--   header  id        = the row's id (the event id outboxd deduplicates on)
--   header  eventType = the row's type
--   value   payload, as JSON text
--
-- Needs a server with wal_level = logical and a replication slot to spare.

CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  DEFAULT now()
);

-- An example application table whose changes emit outbox events.
CREATE TABLE IF NOT EXISTS public.orders (
    id         text PRIMARY KEY,
    status     text,
    updated_at timestamptz
);

-- The connector runs with publication.autocreate.mode=disabled, so the publication
-- must exist before it starts. (Adding WITH (publish = 'insert') would keep the
-- deletes of the insert-then-delete pattern below out of the WAL stream entirely.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'dbz_publication') THEN
        CREATE PUBLICATION dbz_publication FOR TABLE public.outbox;
    END IF;
END
$$;

-- How an application writes an event: in the SAME transaction as its state change,
-- so the event exists if and only if the change committed. The id is the event id:
-- generate it once per event (in the application or with gen_random_uuid()).
--
--   BEGIN;
--   INSERT INTO orders (id, status, updated_at)
--        VALUES ('order-1', 'placed', now());
--   INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
--        VALUES (gen_random_uuid(), 'order', 'order-1', 'OrderPlaced',
--                '{"orderId": "order-1", "status": "placed"}');
--   COMMIT;
--
--   -> Kafka topic outbox.event.order, key order-1, header eventType=OrderPlaced.
--
-- Variant that keeps the outbox table empty: insert the event and delete it again in
-- the same transaction. Logical decoding still sees the insert in the WAL, so Debezium
-- publishes it; the EventRouter ignores the delete (and tombstones.on.delete=false means
-- no tombstone is written). No clean-up job is needed. The id must be known to both
-- statements, so take it from the application (or a psql variable as here):
--
--   BEGIN;
--   UPDATE orders SET status = 'shipped', updated_at = now() WHERE id = 'order-1';
--   INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
--        VALUES ('0b7c4f36-5d5e-4d7c-9a55-3f1f2f0c9a10', 'order', 'order-1', 'OrderShipped',
--                '{"orderId": "order-1", "status": "shipped"}');
--   DELETE FROM outbox WHERE id = '0b7c4f36-5d5e-4d7c-9a55-3f1f2f0c9a10';
--   COMMIT;
