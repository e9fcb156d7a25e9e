"""Running experiments: the run's config (`config`), arms ready to run (`arm`), one block
(`block`), the run loop (`runner`), the run folder's writer (`writer`), its manifest
(`manifest`) and the progress line (`progress`)."""
