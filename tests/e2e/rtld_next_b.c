__attribute__((visibility("default"))) const char* probe_symbol(void) { return "b"; }
