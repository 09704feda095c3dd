// ExecutionOptions' names and parsing (orthopt/execution.h).
#include "orthopt/execution.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace orthopt {

namespace {

struct Field {
  const char* name;
  Toggle ExecutionOptions::*member;
};

const Field kFields[] = {
    {"kernels", &ExecutionOptions::kernels},
    {"banks", &ExecutionOptions::banks},
    {"fused_ns_input", &ExecutionOptions::fused_ns_input},
    {"fold_update", &ExecutionOptions::fold_update},
    {"gram_own_layout", &ExecutionOptions::gram_own_layout},
    {"side_streams", &ExecutionOptions::side_streams},
    {"gram_transposed_result", &ExecutionOptions::gram_transposed_result},
    {"direct_result", &ExecutionOptions::direct_result},
};

const Field& find_field(const std::string& name) {
  for (const Field& f : kFields)
    if (name == f.name) return f;
  std::ostringstream known;
  for (const Field& f : kFields) known << (&f == kFields ? "" : ", ") << f.name;
  TORCH_CHECK_VALUE(false, "argument 'execution': unknown field '", name, "' (known: ", known.str(), ")");
}

}  // namespace

const char* to_string(Toggle t) { return t == Toggle::Auto ? "auto" : t == Toggle::On ? "on" : "off"; }

Toggle parse_toggle(const std::string& s, const std::string& field) {
  if (s == "auto") return Toggle::Auto;
  if (s == "on") return Toggle::On;
  if (s == "off") return Toggle::Off;
  TORCH_CHECK_VALUE(false, "argument 'execution': field '", field, "' must be auto, on or off, got '", s, "'");
}

const std::vector<std::string>& execution_fields() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Field& f : kFields) out.push_back(f.name);
    return out;
  }();
  return names;
}

Toggle get_field(const ExecutionOptions& e, const std::string& field) { return e.*find_field(field).member; }

void set_field(ExecutionOptions& e, const std::string& field, const std::string& value) {
  const Field& f = find_field(field);  // an unknown field before a bad value
  e.*f.member = parse_toggle(value, field);
}

ExecutionOptions parse_execution(const std::string& spec) {
  ExecutionOptions e;
  if (spec == "auto") return e;
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    TORCH_CHECK_VALUE(eq != std::string::npos, "argument 'execution': expected field=value, got '", item, "'");
    set_field(e, item.substr(0, eq), item.substr(eq + 1));
  }
  return e;
}

std::string to_string(const ExecutionOptions& e) {
  std::string out;
  for (const Field& f : kFields)
    if (e.*f.member != Toggle::Auto) out += (out.empty() ? "" : ",") + std::string(f.name) + "=" + to_string(e.*f.member);
  return out.empty() ? "auto" : out;
}

}  // namespace orthopt
