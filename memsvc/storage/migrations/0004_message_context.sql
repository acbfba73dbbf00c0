-- The lexical index of a message includes its conversational context: the message itself
-- (weight A), its neighbours in the session at distance 1 (B) and 2 (C), and the date it was
-- said (D). A question rarely repeats the words of the one turn that answers it, but often
-- those of the exchange around it. Written by the extraction workers (index time); the
-- returned item is still the message itself.
ALTER TABLE messages ADD COLUMN context_tsv tsvector;
CREATE INDEX messages_context_tsv ON messages USING gin (context_tsv);
