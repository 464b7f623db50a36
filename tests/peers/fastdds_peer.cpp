// A minimal ROS 2 wire peer on eProsima Fast DDS 2.9 (ROS 2's default DDS), for interop tests.
//
// Publishes sensor_msgs/JointState on rt/joint_states and echoes every std_msgs/Float64MultiArray
// received on rt/policy_controller/commands to stdout, one JSON object per line. Type names are
// the ROS 2 ones (pkg::msg::dds_::Type_), CDR is written by hand with Fast CDR (no fastddsgen).
// Loopback only: one UDPv4 transport whitelisted to 127.0.0.1, no shared memory, no multicast,
// initial peer 127.0.0.1. Bounded: exits after --count commands (rc 0) or --timeout seconds (rc 3).
//
//   fastdds_peer --domain 42 [--count 5] [--timeout 10] [--hz 50]
//   fastdds_peer --domain 42 --bench 1 [--lockstep 1] --timeout 20 --hz 1000     (benchmarks/ros2_edge.py)
//
// --bench 1: an independent robot for the benchmark. Velocities number the states
// ((i % 4000) / 2000 on every joint, positions 0); each command's arrival is timed in its reader
// listener (steady_clock = CLOCK_MONOTONIC, Python's time.monotonic) and, if it names a state, so is
// its latency from that state's publication. --lockstep 1: state i+1 goes out only once the command
// naming state i arrived (at most 1 s) and not before its period. Runs until --timeout or SIGTERM,
// then prints one line {"bench": {"commands": [[t, data0, lat_ms | null], ...], "published": [t, ...]}}.
//
// JointState number i (i = 0, 1, ...): stamp {1700000000 + i, 123456789}, frame_id "tether_peer",
// name [shoulder, elbow, wrist], position [0.5, -1.25, 0.001 * i], velocity [0.1, 0.2, 0.3],
// effort [] -- the Python test asserts exactly these values.

#include <fastcdr/Cdr.h>
#include <fastcdr/FastBuffer.h>
#include <fastdds/dds/domain/DomainParticipant.hpp>
#include <fastdds/dds/domain/DomainParticipantFactory.hpp>
#include <fastdds/dds/publisher/DataWriter.hpp>
#include <fastdds/dds/publisher/DataWriterListener.hpp>
#include <fastdds/dds/publisher/Publisher.hpp>
#include <fastdds/dds/subscriber/DataReader.hpp>
#include <fastdds/dds/subscriber/DataReaderListener.hpp>
#include <fastdds/dds/subscriber/SampleInfo.hpp>
#include <fastdds/dds/subscriber/Subscriber.hpp>
#include <fastdds/dds/topic/TopicDataType.hpp>
#include <fastdds/dds/topic/TypeSupport.hpp>
#include <fastdds/rtps/transport/UDPv4TransportDescriptor.h>
#include <fastrtps/utils/IPLocator.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace eprosima::fastdds::dds;
using eprosima::fastcdr::Cdr;
using eprosima::fastcdr::FastBuffer;
using eprosima::fastrtps::rtps::InstanceHandle_t;
using eprosima::fastrtps::rtps::SerializedPayload_t;

// ---- messages -------------------------------------------------------------------------------

struct JointState {
  int32_t sec = 0;
  uint32_t nanosec = 0;
  std::string frame_id;
  std::vector<std::string> name;
  std::vector<double> position, velocity, effort;
};

struct Dimension {
  std::string label;
  uint32_t size = 0, stride = 0;
};

struct Float64MultiArray {
  std::vector<Dimension> dim;
  uint32_t data_offset = 0;
  std::vector<double> data;
};

static void write(Cdr& c, const JointState& m) {
  c << m.sec << m.nanosec << m.frame_id << m.name << m.position << m.velocity << m.effort;
}
static void read(Cdr& c, JointState& m) {
  c >> m.sec >> m.nanosec >> m.frame_id >> m.name >> m.position >> m.velocity >> m.effort;
}
static void write(Cdr& c, const Float64MultiArray& m) {
  c << static_cast<uint32_t>(m.dim.size());
  for (const auto& d : m.dim) c << d.label << d.size << d.stride;
  c << m.data_offset << m.data;
}
static void read(Cdr& c, Float64MultiArray& m) {
  uint32_t n = 0;
  c >> n;
  if (n > 4096) throw std::runtime_error("too many dimensions");
  m.dim.resize(n);
  for (auto& d : m.dim) c >> d.label >> d.size >> d.stride;
  c >> m.data_offset >> m.data;
}

// Upper bounds of the CDR size (alignment padding counted generously: at most 7 bytes a field).
static uint32_t bound(const std::string& s) { return 4 + 3 + static_cast<uint32_t>(s.size()) + 1; }
static uint32_t bound(const std::vector<double>& v) { return 4 + 7 + 8 * static_cast<uint32_t>(v.size()); }
static uint32_t bound(const JointState& m) {
  uint32_t n = 4 + 8 + bound(m.frame_id) + 4 + bound(m.position) + bound(m.velocity) + bound(m.effort);
  for (const auto& s : m.name) n += bound(s);
  return n;
}
static uint32_t bound(const Float64MultiArray& m) {
  uint32_t n = 4 + 4 + 4 + bound(m.data);
  for (const auto& d : m.dim) n += bound(d.label) + 8;
  return n;
}

// One hand-written TopicDataType for both messages: keyless, unbounded, ROS 2 type name.
template <typename T>
class RosType : public TopicDataType {
 public:
  explicit RosType(const char* ros_name) {
    setName(ros_name);
    m_typeSize = 4096;  // initial payload size; writers and readers use realloc memory policy
    m_isGetKeyDefined = false;
    auto_fill_type_object(false);
    auto_fill_type_information(false);
  }
  bool serialize(void* data, SerializedPayload_t* payload) override {
    const T& m = *static_cast<T*>(data);
    if (payload->max_size < bound(m)) payload->reserve(bound(m));
    FastBuffer buf(reinterpret_cast<char*>(payload->data), payload->max_size);
    Cdr c(buf, Cdr::DEFAULT_ENDIAN, Cdr::DDS_CDR);
    payload->encapsulation = c.endianness() == Cdr::BIG_ENDIANNESS ? CDR_BE : CDR_LE;
    try {
      c.serialize_encapsulation();
      write(c, m);
    } catch (const std::exception&) {
      return false;
    }
    payload->length = static_cast<uint32_t>(c.getSerializedDataLength());
    return true;
  }
  bool deserialize(SerializedPayload_t* payload, void* data) override {
    FastBuffer buf(reinterpret_cast<char*>(payload->data), payload->length);
    Cdr c(buf, Cdr::DEFAULT_ENDIAN, Cdr::DDS_CDR);
    try {
      c.read_encapsulation();  // throws on XCDR2 (0x0006/0x0007): the peer speaks XCDR1 like ROS 2
      payload->encapsulation = c.endianness() == Cdr::BIG_ENDIANNESS ? CDR_BE : CDR_LE;
      read(c, *static_cast<T*>(data));
    } catch (const std::exception&) {
      return false;
    }
    return true;
  }
  std::function<uint32_t()> getSerializedSizeProvider(void* data) override {
    return [data]() { return 4 + bound(*static_cast<T*>(data)); };
  }
  void* createData() override { return new T(); }
  void deleteData(void* data) override { delete static_cast<T*>(data); }
  bool getKey(void*, InstanceHandle_t*, bool) override { return false; }
};

// ---- output ---------------------------------------------------------------------------------

static std::mutex out_mutex;

static void emit(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mutex);
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

static std::string json(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      o += '\\';
      o += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", ch);
      o += esc;
    } else {
      o += static_cast<char>(ch);
    }
  }
  return o + "\"";
}

static std::string json(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char num[32];
    if (std::isfinite(v[i]))
      std::snprintf(num, sizeof num, "%.17g", v[i]);  // round-trips every double exactly
    else
      std::snprintf(num, sizeof num, "null");
    o += (i ? "," : "") + std::string(num);
  }
  return o + "]";
}

static std::string json(const Float64MultiArray& m) {
  std::ostringstream o;
  o << "{\"topic\":\"rt/policy_controller/commands\",\"layout\":{\"dim\":[";
  for (size_t i = 0; i < m.dim.size(); ++i)
    o << (i ? "," : "") << "{\"label\":" << json(m.dim[i].label) << ",\"size\":" << m.dim[i].size
      << ",\"stride\":" << m.dim[i].stride << "}";
  o << "],\"data_offset\":" << m.data_offset << "},\"data\":" << json(m.data) << "}";
  return o.str();
}

// ---- listeners: matched events help tests wait for discovery instead of sleeping -------------

struct WriterEvents : DataWriterListener {
  void on_publication_matched(DataWriter*, const PublicationMatchedStatus& s) override {
    emit("{\"event\":\"writer_matched\",\"topic\":\"rt/joint_states\",\"count\":" +
         std::to_string(s.current_count) + "}");
  }
};

// ---- bench mode: commands timed as they arrive (listener thread), states numbered ------------

using steady = std::chrono::steady_clock;
static double now_s() { return std::chrono::duration<double>(steady::now().time_since_epoch()).count(); }

struct Bench {
  bool on = false;
  std::mutex m;
  std::condition_variable answered;
  std::vector<double> pub_time = std::vector<double>(4000, -1.0);   // by state number (mod 4000)
  long waiting_for = -1;                                          // lockstep: the state to be answered
  std::vector<std::array<double, 3>> commands;                    // t, data[0], lat_ms (NaN: none)
  std::vector<double> published;
};
static Bench bench;

struct ReaderEvents : DataReaderListener {
  void on_subscription_matched(DataReader*, const SubscriptionMatchedStatus& s) override {
    emit("{\"event\":\"reader_matched\",\"topic\":\"rt/policy_controller/commands\",\"count\":" +
         std::to_string(s.current_count) + "}");
  }
  void on_data_available(DataReader* reader) override {
    if (!bench.on) return;  // the interop mode takes samples in its main loop
    Float64MultiArray cmd;
    SampleInfo info;
    while (reader->take_next_sample(&cmd, &info) == ReturnCode_t::RETCODE_OK) {
      const double t = now_s();
      if (!info.valid_data || cmd.data.empty()) continue;
      const long code = std::lround(cmd.data[0] * 2000.0);
      std::lock_guard<std::mutex> lock(bench.m);
      double lat = std::nan("");
      if (code >= 0 && code < 4000 && bench.pub_time[code] >= 0) lat = (t - bench.pub_time[code]) * 1e3;
      bench.commands.push_back({t, cmd.data[0], lat});
      if (code == bench.waiting_for) {
        bench.waiting_for = -1;
        bench.answered.notify_all();
      }
    }
  }
};

static std::string bench_json() {
  std::lock_guard<std::mutex> lock(bench.m);
  std::ostringstream o;
  o.precision(17);
  o << "{\"bench\":{\"commands\":[";
  for (size_t i = 0; i < bench.commands.size(); ++i) {
    const auto& c = bench.commands[i];
    o << (i ? "," : "") << "[" << c[0] << "," << c[1] << ",";
    if (std::isnan(c[2])) o << "null"; else o << c[2];
    o << "]";
  }
  o << "],\"published\":[";
  for (size_t i = 0; i < bench.published.size(); ++i) o << (i ? "," : "") << bench.published[i];
  o << "]}}";
  return o.str();
}

// ---- main -----------------------------------------------------------------------------------

// A writer's or reader's QoS as ROS 2's default ("reliable, volatile, keep last `depth`"), with realloc payloads
// (the types are unbounded).
template <typename Qos>
static Qos ros_qos(Qos qos, int32_t depth) {
  qos.reliability().kind = RELIABLE_RELIABILITY_QOS;
  qos.durability().kind = VOLATILE_DURABILITY_QOS;
  qos.history().kind = KEEP_LAST_HISTORY_QOS;
  qos.history().depth = depth;
  qos.endpoint().history_memory_policy = eprosima::fastrtps::rtps::PREALLOCATED_WITH_REALLOC_MEMORY_MODE;
  return qos;
}

static std::atomic<bool> stop{false};

static void usage_exit(const char* why) {
  std::fprintf(stderr, "fastdds_peer: %s\nusage: fastdds_peer --domain ID [--count N] [--timeout S] [--hz H]\n",
               why);
  std::exit(2);
}

int main(int argc, char** argv) {
  long domain = -1, count = 5, bench_on = 0, lockstep = 0;
  double timeout_s = 10.0, hz = 50.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage_exit(("missing value for " + a).c_str());
    char* end = nullptr;
    const char* v = argv[++i];
    if (a == "--domain") domain = std::strtol(v, &end, 10);
    else if (a == "--count") count = std::strtol(v, &end, 10);
    else if (a == "--timeout") timeout_s = std::strtod(v, &end);
    else if (a == "--hz") hz = std::strtod(v, &end);
    else if (a == "--bench") bench_on = std::strtol(v, &end, 10);
    else if (a == "--lockstep") lockstep = std::strtol(v, &end, 10);
    else usage_exit(("unknown argument " + a).c_str());
    if (end == v || *end != '\0') usage_exit(("bad value for " + a + ": " + v).c_str());
  }
  if (domain < 0 || domain > 232) usage_exit("--domain must be in 0..232");
  if (count < 0 || !(timeout_s > 0 && timeout_s <= 600) || !(hz > 0 && hz <= 1000))
    usage_exit("need --count >= 0, 0 < --timeout <= 600, 0 < --hz <= 1000");
  bench.on = bench_on != 0;
  std::signal(SIGINT, [](int) { stop = true; });
  std::signal(SIGTERM, [](int) { stop = true; });

  // Participant: loopback UDPv4 only. No builtin transports (so no SHM), no multicast locators
  // (giving explicit unicast metatraffic/default locators suppresses the default multicast ones).
  DomainParticipantQos pqos;
  pqos.name("tether_fastdds_peer");
  auto udp = std::make_shared<eprosima::fastdds::rtps::UDPv4TransportDescriptor>();
  udp->interfaceWhiteList.emplace_back("127.0.0.1");
  pqos.transport().use_builtin_transports = false;
  pqos.transport().user_transports.push_back(udp);
  eprosima::fastrtps::rtps::Locator_t lo;
  lo.kind = LOCATOR_KIND_UDPv4;
  eprosima::fastrtps::rtps::IPLocator::setIPv4(lo, 127, 0, 0, 1);
  auto& builtin = pqos.wire_protocol().builtin;
  builtin.initialPeersList.push_back(lo);           // port 0: every well-known participant port
  builtin.metatrafficUnicastLocatorList.push_back(lo);
  pqos.wire_protocol().default_unicast_locator_list.push_back(lo);

  auto* factory = DomainParticipantFactory::get_instance();
  DomainParticipant* participant = factory->create_participant(static_cast<DomainId_t>(domain), pqos);
  if (!participant) {
    emit("{\"event\":\"error\",\"what\":\"create_participant failed\"}");
    return 1;
  }
  TypeSupport joint_type(new RosType<JointState>("sensor_msgs::msg::dds_::JointState_"));
  TypeSupport cmd_type(new RosType<Float64MultiArray>("std_msgs::msg::dds_::Float64MultiArray_"));
  joint_type.register_type(participant);
  cmd_type.register_type(participant);
  Topic* joint_topic = participant->create_topic("rt/joint_states", joint_type.get_type_name(), TOPIC_QOS_DEFAULT);
  Topic* cmd_topic =
      participant->create_topic("rt/policy_controller/commands", cmd_type.get_type_name(), TOPIC_QOS_DEFAULT);
  Publisher* publisher = participant->create_publisher(PUBLISHER_QOS_DEFAULT);
  Subscriber* subscriber = participant->create_subscriber(SUBSCRIBER_QOS_DEFAULT);

  // ROS 2 default QoS ("reliable, volatile, keep last 10"); the command reader keeps 100.
  WriterEvents writer_events;
  ReaderEvents reader_events;
  DataWriter* writer = publisher->create_datawriter(joint_topic, ros_qos(DATAWRITER_QOS_DEFAULT, 10), &writer_events);
  DataReader* reader = subscriber->create_datareader(cmd_topic, ros_qos(DATAREADER_QOS_DEFAULT, 100), &reader_events);
  if (!joint_topic || !cmd_topic || !writer || !reader) {
    emit("{\"event\":\"error\",\"what\":\"entity creation failed\"}");
    return 1;
  }
  emit("{\"event\":\"ready\",\"domain\":" + std::to_string(domain) + "}");

  if (bench.on) {  // the benchmark's robot: numbered states on a fixed grid, commands timed by the listener
    const auto period = std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(1.0 / hz));
    const auto end = steady::now() + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(timeout_s));
    auto next = steady::now();
    JointState js;
    js.frame_id = "tether_peer";
    js.name = {"shoulder", "elbow", "wrist"};
    js.position = {0.0, 0.0, 0.0};
    for (long i = 0; !stop && steady::now() < end; ++i) {
      const double v = static_cast<double>(i % 4000) / 2000.0;
      js.sec = static_cast<int32_t>(i);
      js.velocity = {v, v, v};
      {
        std::lock_guard<std::mutex> lock(bench.m);
        bench.pub_time[i % 4000] = now_s();
        bench.published.push_back(bench.pub_time[i % 4000]);
        if (lockstep) bench.waiting_for = i % 4000;
      }
      writer->write(&js);
      if (lockstep) {
        std::unique_lock<std::mutex> lock(bench.m);
        bench.answered.wait_for(lock, std::chrono::seconds(1), [] { return bench.waiting_for < 0 || stop; });
      }
      next += period;
      if (lockstep && steady::now() > next) next = steady::now();  // a late answer shifts the grid
      std::this_thread::sleep_until(next);
    }
    participant->delete_contained_entities();   // no more listener calls after this
    emit(bench_json());
    factory->delete_participant(participant);
    return 0;
  }

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(1.0 / hz));
  auto next_pub = start;
  long published = 0, received = 0;
  while (!stop && received < count && clock::now() < deadline) {
    if (clock::now() >= next_pub) {
      JointState js;
      js.sec = 1700000000 + static_cast<int32_t>(published);
      js.nanosec = 123456789u;
      js.frame_id = "tether_peer";
      js.name = {"shoulder", "elbow", "wrist"};
      js.position = {0.5, -1.25, 0.001 * static_cast<double>(published)};
      js.velocity = {0.1, 0.2, 0.3};
      if (writer->write(&js)) ++published;
      next_pub += period;
    }
    Float64MultiArray cmd;
    SampleInfo info;
    while (received < count && reader->take_next_sample(&cmd, &info) == ReturnCode_t::RETCODE_OK) {
      if (!info.valid_data) continue;
      emit(json(cmd));
      ++received;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const bool done = received >= count;
  emit("{\"event\":\"done\",\"published\":" + std::to_string(published) + ",\"received\":" +
       std::to_string(received) + ",\"reason\":\"" + (done ? "count" : stop ? "signal" : "timeout") + "\"}");

  participant->delete_contained_entities();
  factory->delete_participant(participant);
  return done ? 0 : 3;
}
