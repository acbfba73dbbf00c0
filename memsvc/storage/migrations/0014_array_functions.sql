-- The set operations a reinforcing write applies to a memory's text arrays, as functions
-- (storage.memories.ON_DUPLICATE_REINFORCE): the same SQL as the subqueries they replace,
-- because Citus refuses any subquery inside an INSERT, its ON CONFLICT clause included.
-- On Citus these are created on every node (CREATE FUNCTION is propagated).

-- The distinct elements of a || b, sorted.
CREATE FUNCTION memsvc_sorted_union(a text[], b text[]) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT DISTINCT unnest(a || b) ORDER BY 1)
$$;

-- The distinct elements of a other than drop, sorted.
CREATE FUNCTION memsvc_sorted_distinct_except(a text[], drop text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT DISTINCT s FROM unnest(a) AS s WHERE s <> drop ORDER BY 1)
$$;
